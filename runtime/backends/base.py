"""The backend interface: what the executor needs from a machine, and nothing more.

A backend owns memory (one arena per GPU, one host storage buffer, all allocated in `prepare`), runs a
vertex asynchronously on a lane (`submit`), and reports completions (`wait`, which blocks or advances a
virtual clock). The executor never looks inside: the cuda, cpu and sim backends plug in alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime.graph import ExecGraph, Lane
from runtime.residency import Residency

ATTENTION_PROVIDERS = ("auto", "torch-cudnn", "torch-flash", "torch-efficient", "triton", "cublas")
"""The cuda backend's attention providers (runtime/backends/cuda/attention.py), named here where the CLI
reads them without importing numba; `auto` is torch-cudnn when torch with CUDA is importable, else cublas,
and a run planned under a budget ranks torch-cudnn against triton by the sim where both can run
(runtime.api, `plan_choosing_attention`)."""


STREAMING_QUEUE_DEPTH = 3
"""Vertices per compute lane (`queue_depth`) of the cuda and sim backends by default, for a plan that
streams. Measured in one call on the H200 (2026-12-03, seventh session; docs/benchmarks-log.md), 7b
nondet and fixed, three runs each, against 2: 32k at 8 GiB 1.300 s against 1.334 (fixed 1.317 against
1.342), 8k at 1 GiB 0.269 against 0.276 (0.264 against 0.272), 8k at 2 GiB 0.238 both, 32k at 1 GiB
1.518 against 1.508 (1.507 against 1.502). Two deep, a lane of short kernels (rope, rmsnorm, the adds)
drained while the loop was late: at 32k / 8 GiB the GPU idled 49 ms waiting for it under nondet. The
sim puts 3 within -4.6% and +1.0% of 2 over bench/fit_cost.py's points. 4 was not measured on the GPU."""

RESIDENT_QUEUE_DEPTH = 8
"""Vertices per compute lane (`lane_depth`) of the cuda and sim backends for a plan that moves nothing
between host and GPUs: its compute lanes run kernel after small kernel (a 7b decode step with everything
resident is some 700 of them), and a lane two deep drains before the host has learned of a completion
and queued the next. Measured on the H200 (7b, B=16, 2048 tokens, 40 GiB): a step's run took 53.8 ms two
deep and 33.7 ms eight deep. Plans that stream keep `queue_depth` (STREAMING_QUEUE_DEPTH): a vertex
queued early on a compute stream can wait there for a reload while another could have run."""


def compute_depth(queue_depth: int, lookahead: bool, graph: ExecGraph | None) -> int:
    """How many vertices a compute lane of a device backend holds for `graph`: `queue_depth`, or
    `resident_depth` for a plan that moves nothing (None: not known yet)."""
    if graph is None or graph.moves_host_data:
        return queue_depth
    return resident_depth(queue_depth, lookahead)


def resident_depth(queue_depth: int, lookahead: bool) -> int:
    """The deepest a compute lane queues, for a plan that moves nothing: at least RESIDENT_QUEUE_DEPTH
    with `lookahead` (without it, one vertex at a time: `queue_depth`)."""
    return max(queue_depth, RESIDENT_QUEUE_DEPTH) if lookahead else queue_depth


Piece = tuple[int, int, np.ndarray]
"""(start, stop, view): rows [start, stop) of an output's first axis go into `view`, of shape [stop - start,
*the output's other axes] and the output's dtype, each row contiguous (`rows_contiguous`): a sequence's
rows of a batched prefill's k or v block, into its place of a token-major cache (`execute(outputs_into=)`)."""

OutputTarget = np.ndarray | list[Piece]
"""Where `execute(outputs_into=)` puts one output: an array of its shape and dtype, or a list of pieces."""


def rows_contiguous(view: np.ndarray) -> bool:
    """Whether `view` (one axis or more) is rows that each lie contiguous in memory, ascending at least a
    row apart along its first axis (the rows may be strided: a 2-D copy's pitch is that stride)."""
    if view.ndim == 0 or not view[:1].flags.c_contiguous:  # numpy ignores the stride of an axis of one
        return False
    return view.shape[0] < 2 or view.strides[0] >= view[:1].nbytes


@dataclass(frozen=True)
class Completion:
    """A vertex finished (or raised) on a lane; times are on the backend's clock, in seconds."""

    vertex: int
    lane: int
    start: float
    end: float
    error: BaseException | None = None


class Backend:
    """Base class of backends; see the module docstring for the contract of each method."""

    name = "backend"
    needs_data = True
    """False for backends that compute no values (sim): the runtime then makes no input arrays."""
    device_deps = False
    """True when the backend enforces dependencies itself (stream order, event waits): the executor may
    then submit a vertex whose dependencies are submitted but not finished."""
    queue_depth = 1
    """How many submitted, unfinished vertices one lane may hold (more than 1 only with device_deps)."""
    inputs_time = 0.0
    """Seconds the last `prepare` spent putting the inputs in place (reading a checkpoint into host storage)."""

    def lane_depth(self, lane: Lane) -> int:
        """`queue_depth` for `lane`; a backend may queue deeper on some lanes (the cuda copy engines)."""
        return self.queue_depth

    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        """Allocate arenas and storage, place the inputs, start workers. The only allocation of a run.
        A later `prepare` (after `read_outputs`) loads another memgraph onto what is there, allocating
        only what the new one needs beyond it (`execute(..., close=False)`). `keep`: inputs (by task)
        already in place from the last run (runtime/residency.py), mapped to None (copy nothing) or to
        the (start, stop) ranges of flat rows that changed (copy only those, residency.refreshed); a backend that reallocates
        the memory holding one must copy it all the same."""
        raise NotImplementedError

    def limit_copies(self, limits: Mapping[int, int]) -> None:
        """For the run that follows `prepare`: the reload vertices in `limits` (vertex -> rows) copy only
        that many leading rows of their tensor (runtime/residency.py, `copy_limits`); every other copy
        moves it whole. The caller vouches that no kernel reads a row past them. Copying more is never
        wrong, so the default copies everything."""

    def held(self) -> Residency:
        """What this backend's memory still holds from its last run (runtime/residency.py)."""
        held = self.__dict__.get("_held")
        if held is None:
            held = self.__dict__["_held"] = Residency()
        return held

    def now(self) -> float:
        """The backend clock, in seconds since `prepare`."""
        raise NotImplementedError

    def submit(self, vertex: int, lane: Lane) -> None:
        """Start `vertex` on `lane`, which has room; returns at once. Vertices of one lane run in submission order."""
        raise NotImplementedError

    def wait(self) -> list[Completion]:
        """Block until at least one submitted vertex completes; return every completion available, in lane order."""
        raise NotImplementedError

    def run_starts(self) -> None:
        """A run of the prepared graph starts (the executor's first call, every run, whether or not
        `prepare` came before it: a prepared backend runs its graph again). A backend drops here what it
        kept from the last run's values (the cuda backend: attention_grad's `GradShare`). By default
        nothing is done."""

    def pieces_ahead(self, tasks: frozenset[str]) -> None:
        """Before `prepare`: the outputs the next run's `output_targets` names in pieces (empty: none). A
        backend may then keep no storage of its own for what only those pieces read (the cuda backend: the
        storage of such an output's first offload where no reload reads it; the pieces are its only copy).
        By default nothing is done with it."""

    def output_targets(self, into: Mapping[str, OutputTarget]) -> None:
        """For the run that follows `prepare`: where the caller wants those outputs (task -> an array of
        the output's shape and dtype, or its `Piece`s, checked by `runtime.execute`). A backend may write
        them itself, straight from where the output is computed (the cuda backend copies it from the GPU
        right after its vertex): `read_outputs` then returns the caller's array in the output's place, or
        leaves a pieced output out. Whatever it did not write it returns as usual, and `runtime.execute`
        copies it into the caller's arrays after the run (so it need not copy such an output first:
        `copy` does not apply to it). By default nothing is written here."""

    def read_outputs(self, copy: bool = True) -> dict[str, np.ndarray]:
        """Copies of the memgraph's outputs, by taskgraph id (empty for backends without data), but those
        `output_targets` named. `copy=False`: arrays of the backend's own memory, valid until its next run
        (a caller that uses them at once)."""
        raise NotImplementedError

    def external_inputs(self) -> set[str]:
        """Inputs of the memgraph loaded last that the backend reads from the caller's arrays where they
        are (nothing was copied for them; the cuda backend's page-locked inputs); none by default."""
        return set()

    def notes(self) -> list[str]:
        """Extra lines for the run summary (memory taken, providers chosen); none by default."""
        return []

    def close(self) -> None:
        """Stop and join workers; safe to call twice and after a failure."""
