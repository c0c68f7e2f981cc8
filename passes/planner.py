"""The offload planner: simulate one run of a placed taskgraph and write the memgraph it implies.

State: one `DeviceMemory` per GPU (passes/allocator.py), and per tensor its GPU copy (a memgraph node
or -1), its storage copy (an offload or a storage input, or -1), and its remaining uses in the schedule.

Per task: find room on each GPU it touches for the operands in storage and the output, all at once
(`_make_room`), emit their reloads and the node, then free the tensors nobody reads again. Room is
found on copies of the memory, so a layout that fails emits nothing: first each tensor in turn in
free room or the cheapest window to clear; then largest first, also moving operands already on the
GPU if they fragment it; last, everything out and the op's working set packed from 0, which cannot
fail once the working set fits the budget. No operand is ever reloaded twice for one op.

Eviction weighs next use against bytes moved (Belady with costs, `_victim_cost`): evicting a tensor
moves a reload at its next use, plus an offload now unless storage already holds it or it is an
input nobody has read (that one is rewritten to start in CPU storage: it never needed the GPU); the
cost is those bytes per step until they are due, summed over a window. Among clean tensors of one
size this is Belady's farthest next use.

An offload depends only on its tensor's GPU copy (a data edge): it reads, so it runs beside the
tensor's other readers, and the next writer of the location waits for it and for them
(turnip-insert-memory-deps adds those edges). Inputs start on their GPU in first-use order while
they fit. `loc` and `storage` sizes are exact byte sizes; the allocator reserves them rounded up to
the alignment.

CPU storage is planned too (`self.storage`, a `DeviceMemory` that grows): an offload takes the free
region a dead offloaded tensor left, the one freed longest ago, and grows the buffer only when none
fits; so host memory (and the GPU's page tables for it) follows the offloaded bytes live at once, not
all the bytes ever offloaded. turnip-insert-memory-deps orders the new offload after the old copy's
reloads, as on a GPU. An input's region is always new and never freed (its value stays in place for
the next run of the plan, runtime/residency.py), and so is an output's.

Weight room stays weight room (`inputs="gpu"`, issue 26): when an input that started on the GPU dies,
its room is held by a placeholder (`_hold`) while an input of that size waits in storage for its first
reload, and the next such reload takes the oldest hold of its size (`_held_room`) unless free room
was freed before it; an input reloaded into a hold passes its room on the same way. (A weight read by
many token blocks dies late in its layer, and tying the next layer's copy to its room would hold that
reload back a layer.) Activations take other free room first (a hold is not
free to `place_free`) and evict holds at no cost when nothing else fits. So a reload's memory edge
points at the readers of a weight that died long ago, not at the last activations, and the host link
streams the next layers while the resident ones compute, as far ahead as the starting weights reach.

Rematerialization (`remat`, off by default): an evicted tensor whose producer is a kernel may be
dropped instead of offloaded when recomputing it costs less than moving it (`_drop_for_recompute`),
and is then recomputed at its next use: its kernel is emitted again, as a second kernel node of its
task (`_recompute`). Its operands must be on the GPU or in storage when it is dropped, or pending and
recomputed no later, or dead and gone and then recomputed first themselves, from operands on the GPU or
in storage (`REMAT_DEPTH` levels: the normed input behind the MLP's gate and up projections, which a
LoRA step's backward reads; 7b 4k at 8 GiB, sim 0.667 -> 0.599 s, 3.5 GB fewer reloads). Each operand of
those recomputes gets a use at that step, so it stays on the GPU or is offloaded when evicted (a tensor
a pending recompute reads is never dropped). So the recomputes a drop implies are fixed when it is made:
their missing operands come back as reloads, and a tensor dropped for recompute never needs an offload
that did not happen. With `REMAT_ADVANCE` (off by default) a later drop may move a pending recompute it
reads to an earlier step (`_advance`): only its step changes, the uses its operands hold move with it.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from passes.allocator import ALIGN, NEVER, DeviceMemory, aligned
from passes.compact import TaskView
from turnip_ir.cost import CostModel
from turnip_ir.memgraph import MemGraph, MemNode
from turnip_ir.taskgraph import TaskGraph

NEAR_USE = 16
"""Steps within which a stored operand's next read after a recompute makes the recompute's reload of it
free (`_reload_moves`): the reload comes earlier and the operand is held that much longer."""
REMAT_DEPTH = 1
"""How many dead producers deep a recompute may reach (`_recompute_plan`): 1 computes a dead operand
again before the tensor (the normed input of the MLP's gate and up projections)."""
REMAT_ADVANCE = False
"""Whether a drop may move a pending recompute it needs earlier, to its own due step (`_advance`), instead of
giving up (the operand's recompute due after the tensor's: attn_norm, recomputed for its LoRA gradient,
behind q after RoPE). Off, with `REMAT_DEPTH` 1, by default: see docs/passes.md, "Rematerialization", for
what the two together do to the sim's LoRA steps (faster where the link binds, slower where compute does)."""


class Planner:
    """One simulation; `run()` returns the memgraph. The caller has checked that every working set fits."""

    def __init__(
        self, graph: TaskGraph, view: TaskView, budget: int, schedule: list[int], placement: str = "loosest", align: int = ALIGN,
        inputs_on_gpu: bool = True, recur: bool = False, gpu_start: set[str] | None = None, remat: CostModel | None = None,
        preferred: dict | None = None,
    ) -> None:
        self.graph, self.view, self.schedule, self.align = graph, view, schedule, align
        self.out = MemGraph(graph.devices, budget)
        self.memory = [DeviceMemory(budget // align * align, placement) for _ in range(graph.devices)]
        n = len(view)
        self.tasks = list(graph.nodes.values())
        self.operands = [list(dict.fromkeys(operands)) for operands in view.inputs]
        self.size = [aligned(nbytes, align) for nbytes in view.nbytes]
        self.nbytes = view.nbytes
        self.steps = len(schedule)
        self.gpu = [-1] * n
        self.store = [-1] * n
        self.uses: list[list[int]] = [[] for _ in range(n)]
        for step, i in enumerate(schedule):
            for o in self.operands[i]:
                self.uses[o].append(step)
        self.next = [0] * n
        self.is_output = [False] * n
        for o in view.outputs:
            self.is_output[o] = True
        self.storage = DeviceMemory(0)
        """CPU storage: offloaded tensors' regions, reused once their tensor is dead; inputs' regions."""
        self.step = 0
        self.inputs_on_gpu = inputs_on_gpu
        """False: every input starts in CPU storage (weights in host memory), and is reloaded where read."""
        self.unread: set[int] = set()
        """Input nodes placed on a GPU that nobody has read yet."""
        self.recur = recur
        """Inputs recur: the next run reads them again in the same order (a decode step's weights and
        caches). An input still in its starting place after its last read stays there while its room is
        not needed (`_dormant`), and costs a reload at its first use in the next run when evicted."""
        self.gpu_start = gpu_start
        """The inputs that may start on a GPU (None: any that fits; `recur` plans pass the survivors of
        the round before, passes/insert_offload.py)."""
        self.preferred = preferred or {}
        """Input task -> (GPU, offset, bytes) where it is now (a prepared backend's `Residency`): it starts
        there again when it starts on the GPU and that room is free, so the backend need not copy it."""
        self.started = [-1] * n
        """Per input, the memgraph node that put it on its GPU at the start (-1: it started in storage)."""
        self.remat = remat
        """The cost model that weighs recomputing against moving; None: never recompute."""
        self.pending: set[int] = set()
        """Tensors dropped from their GPU, to be recomputed at their next use."""
        self.due: dict[int, int] = {}
        """Per pending tensor, the step its recompute comes at (its operands have a use there)."""
        self.held = [0] * n
        """Per tensor, the pending recomputes that read it: while any does, it is never dropped."""
        self.seconds: dict[int, float] = {}
        """Per tensor, the cost model's seconds to compute it (filled as remat asks)."""
        self.ring = inputs_on_gpu and not recur and gpu_start is None
        """Weight room is kept for weights (`_hold`): the room of an input that started on the GPU, or was
        reloaded into such room, is held for the next input's reload when it dies. Only where the weights
        start on the GPU (inputs=gpu): the inputs named to start there under inputs=host are activations,
        and holding their room for weights left a tight plan 4-10% slower in the sim (7b 8k at 1 GiB)."""
        self.holds: dict[int, tuple[int, int, int]] = {}
        """Room held for reloads, by placeholder tensor (numbered from len(view)): (GPU, bytes, step it was freed)."""
        self.next_hold = n
        self.ringed = [False] * n
        """Per input, whether its room is weight room (it started on the GPU, or was reloaded into a hold)."""
        self.awaiting: dict[tuple[int, int], int] = {}
        """Per (GPU, aligned size), the inputs in storage not yet reloaded once: how many holds can be used."""
        self.awaited = [False] * n
        """Per input, whether `awaiting` counts it."""

    def run(self) -> MemGraph:
        self._place_inputs()
        for step, i in enumerate(self.schedule):
            self.step = step
            self._run_task(i)
        assert not self.pending, "a tensor dropped for recompute was never recomputed"
        for o in self.view.outputs:
            holder = self.gpu[o] if self.gpu[o] >= 0 else self.store[o]
            self.out.outputs[self.view.ids[o]] = holder
        return self.out

    def _place_inputs(self) -> None:
        view = self.view
        inputs = [i for i, op in enumerate(view.ops) if op == "input"]
        inputs.sort(key=lambda i: self.uses[i][0] if self.uses[i] else NEVER)
        wanted = {i for i in inputs if self.inputs_on_gpu and (self.uses[i] or self.is_output[i])
                  and (self.gpu_start is None or view.ids[i] in self.gpu_start)}
        where = {i: self._kept_place(i) for i in inputs if i in wanted and view.ids[i] in self.preferred}
        for i, start in where.items():  # where a prepared backend holds them now, first
            if start is not None:
                self.memory[view.devices[i]].take(start, self.size[i], i)
        for i in inputs:
            d, size = view.devices[i], self.size[i]
            start = where.get(i)
            if start is None:
                start = self.memory[d].place_free(size) if i in wanted else None
                if start is not None:
                    self.memory[d].take(start, size, i)
            if start is not None:
                self.gpu[i] = self.started[i] = self._emit("input", i, d, loc=(start, view.nbytes[i]), inputs=())
                self.unread.add(self.gpu[i])
                self.ringed[i] = self.ring
            else:
                self.store[i] = self._emit("input", i, None, storage=self._storage(i), inputs=())
                self._await(i, True)

    def _kept_place(self, i: int) -> int | None:
        """The offset where input `i` is held now, if this plan can start it there (same GPU, aligned, free)."""
        device, start, nbytes = self.preferred[self.view.ids[i]]
        memory, size = self.memory[self.view.devices[i]], self.size[i]
        if device != self.view.devices[i] or nbytes != self.view.nbytes[i] or start % self.align or start + size > memory.capacity:
            return None
        return start if not memory.holders(start, size) else None

    def _run_task(self, i: int) -> None:
        view, gpu = self.view, self.gpu
        operands = self.operands[i]
        if self.pending:
            for t in operands:
                if t in self.pending:
                    self._recompute(t)
        missing = [o for o in operands if gpu[o] < 0]
        if missing or not self._room_for_one(self.memory[view.devices[i]], i, operands):
            wanted: dict[int, list[int]] = {}
            for t in missing + [i]:
                wanted.setdefault(view.devices[t], []).append(t)
            for d, items in wanted.items():
                self._reload_room(d, items, operands, i)
        d = view.devices[i]
        start = self.memory[d].where[i]
        kind = "move" if view.ops[i] == "move" else "kernel"
        gpu[i] = self._emit(kind, i, d, loc=(start, view.nbytes[i]), inputs=tuple([gpu[o] for o in view.inputs[i]]))
        if self.unread:
            self.unread.difference_update([gpu[o] for o in operands])
        uses, later = self.uses, self.next
        for o in operands:
            later[o] += 1
            if later[o] == len(uses[o]):
                self._drop_if_dead(o)
        self._drop_if_dead(i)

    def _reload_room(self, d: int, items: list[int], operands: list[int], output: int) -> None:
        """Room on GPU `d` for `items`, and a reload emitted for each of them but `output`: an input takes
        held weight room (`_held_room`) where some is its size, the rest `_make_room`."""
        placed = {t: self._held_room(d, t) for t in items if self.holds and t != output and self.view.ops[t] == "input"}
        placed = {t: start for t, start in placed.items() if start is not None}
        rest = [t for t in items if t not in placed]
        if rest:
            placed.update(self._make_room(d, rest, operands))
        for t, start in placed.items():
            if t != output:
                if self.awaited[t]:
                    self._await(t, False)
                self.gpu[t] = self._emit("reload", t, d, loc=(start, self.view.nbytes[t]), inputs=(self.store[t],))

    def _make_room(self, d: int, items: list[int], operands: list[int]) -> dict[int, int]:
        """Place `items` (reloads and the output) on GPU `d`, evicting what the cheapest layout needs.

        Layouts are tried on copies of the memory, cheapest first: each item in turn in free room or the
        cheapest window; then largest first, moving 0, 1, ... of the operands already there (those with
        a storage copy and small first), which then come back as reloads; last, everything out and the
        working set packed from 0, which always fits. Nothing is emitted for a layout that fails, so an
        operand is never reloaded twice for one op.
        """
        memory, size = self.memory[d], self.size.__getitem__
        if len(items) == 1 and self._room_for_one(memory, items[0], operands):
            return {items[0]: memory.where[items[0]]}
        operands = set(operands)
        resident = sorted((o for o in operands if o in memory.where), key=lambda o: (self.store[o] < 0, size(o), o))
        layouts = [(items, [])] + [(items + resident[:k], resident[:k]) for k in range(len(resident) + 1)]
        for k, (placing, moved) in enumerate(layouts):
            trial = memory.copy()
            for o in moved:
                trial.release(o, self.step)
            ranked = placing if k == 0 else sorted(placing, key=size, reverse=True)
            fitted = trial.fit([(t, size(t)) for t in ranked], operands, self._victim_cost, self.step)
            if fitted is not None:
                return self._adopt(d, trial, moved + fitted[0], fitted[1])
        trial = memory.copy()
        for t in memory.where:
            trial.release(t, self.step)
        starts, top = {}, 0
        for t in sorted(items + resident, key=size, reverse=True):
            trial.take(top, size(t), t)
            starts[t], top = top, top + size(t)
        return self._adopt(d, trial, list(memory.where), starts)

    def _room_for_one(self, memory: DeviceMemory, t: int, operands: list[int]) -> bool:
        """The first layout of `_make_room` for a single tensor, done in place (nothing to undo when it
        fails: the search changes nothing). Most ops only need room for their output."""
        size = self.size[t]
        start = memory.place_free(size)
        if start is None:
            start = memory.best_window(size, set(operands), self._victim_cost)
            if start is None:
                return False
            for victim in memory.holders(start, size):
                memory.release(victim, self.step)
                self._write_back(victim)
        memory.take(start, size, t)
        return True

    def _adopt(self, d: int, trial: DeviceMemory, evicted: list[int], starts: dict[int, int]) -> dict[int, int]:
        """Make `trial` GPU `d`'s memory: write back what it evicted; returns the placed items' starts."""
        for t in evicted:
            self._write_back(t)
        self.memory[d] = trial
        return starts

    def _drop_if_dead(self, t: int) -> None:
        if self.next[t] == len(self.uses[t]) and not self.is_output[t] and self.gpu[t] >= 0 and not self._dormant(t):
            memory = self.memory[self.view.devices[t]]
            start = memory.where[t]
            memory.release(t, self.step)
            self.gpu[t] = -1
            if self.ringed[t]:
                self._hold(t, memory, start)
            if self.store[t] >= 0 and self.out.nodes[self.store[t]].op == "offload":
                self.storage.release(t, self.step)
                self.store[t] = -1  # no copy left: a recompute can no longer read it

    def _hold(self, t: int, memory: DeviceMemory, start: int) -> None:
        """Hold the room a dead weight freed for the next weight's reload, while an input of its size waits
        in storage for a hold: activations take other free room first, so the reload depends only on the
        dead weight's readers and the host link streams into the room the resident layers free (issue 26).
        Evicting a hold costs nothing (`_victim_cost`): activations that find no other room take it."""
        d, size = self.view.devices[t], self.size[t]
        live = sum(1 for device, held, _ in self.holds.values() if (device, held) == (d, size))
        if self.awaiting.get((d, size), 0) > live:
            hold, self.next_hold = self.next_hold, self.next_hold + 1
            memory.take(start, size, hold)
            self.holds[hold] = (d, size, self.step)

    def _held_room(self, d: int, t: int) -> int | None:
        """The start of the oldest hold of `t`'s size on GPU `d`, now given to `t`; None when there is none or
        free room was freed before it."""
        memory, size = self.memory[d], self.size[t]
        oldest = min(((freed, hold) for hold, (device, held, freed) in self.holds.items() if (device, held) == (d, size)), default=None)
        if oldest is None:
            return None
        freed, hold = oldest
        free = memory.place_free(size)
        if free is not None and memory.freed_at(free, size) < freed:
            return None  # free room freed even longer ago: the reload takes that (`_make_room`), the hold stays
        start = memory.where[hold]
        memory.release(hold, freed)
        del self.holds[hold]
        memory.take(start, size, t)
        self.ringed[t] = True
        return start

    def _await(self, t: int, waiting: bool) -> None:
        """Count input `t` in `awaiting` (it waits in storage for its first reload), or stop counting it."""
        if self.awaited[t] != waiting and self.uses[t]:
            self.awaited[t] = waiting
            key = (self.view.devices[t], self.size[t])
            self.awaiting[key] = self.awaiting.get(key, 0) + (1 if waiting else -1)

    def _dormant(self, t: int) -> bool:
        """A recurring input read for the last time in this run, still where it started: it stays, for
        the next run, until its room is needed."""
        return self.recur and self.gpu[t] >= 0 and self.gpu[t] == self.started[t] and self.next[t] == len(self.uses[t])

    def _next_use(self, t: int) -> int:
        return self.uses[t][self.next[t]] if self.next[t] < len(self.uses[t]) else NEVER

    def _victim_cost(self, t: int) -> int:
        """Bytes that evicting `t` moves, per step until they are due (Belady with costs), times 2^24.

        It moves a reload at its next use, plus an offload now unless storage holds it or it is an
        input nobody has read (that one simply starts in storage). An output not read again is due
        at the end. Among clean tensors of one size this is Belady: the farthest next use goes first.
        Integers, so that sums over a window are exact.
        """
        if t in self.holds:
            return 0
        uses, k = self.uses[t], self.next[t]
        nbytes = self.nbytes[t]
        if self._dormant(t):  # due at its first read in the next run; no offload: the host holds it
            return (nbytes << 24) // (self.steps + (uses[0] if uses else 0) - self.step)
        if k < len(uses):
            use = uses[k]
            due, moved = (use if use < self.steps else self.steps), nbytes
        else:
            use, due, moved = NEVER, self.steps, 0
        if self.store[t] < 0 and (use < NEVER or self.is_output[t]) and self.gpu[t] not in self.unread:
            moved += nbytes
        return (moved << 24) // max(1, due - self.step)  # 0 only for an op's operand a recompute may evict

    def _write_back(self, t: int) -> None:
        """Take tensor `t` off its GPU (its memory is already freed), offloading it unless storage holds it.

        The offload waits only for the tensor's writer: it reads, so it runs beside the other readers;
        the next writer of the location waits for it and for them (turnip-insert-memory-deps).
        """
        if t in self.holds:
            del self.holds[t]
            return
        if self.gpu[t] in self.unread:
            self._start_in_storage(t)
        elif self._dormant(t):
            pass  # read for the last time in this run; the runtime puts it back before the next run
        elif self.remat is not None and self._drop_for_recompute(t):
            pass
        elif self.store[t] < 0:
            d = self.view.devices[t]
            self.store[t] = self._emit("offload", t, d, storage=self._storage(t, reuse=True), inputs=(self.gpu[t],))
        self.gpu[t] = -1

    def _drop_for_recompute(self, t: int) -> bool:
        """Drop `t` (leaving its GPU) to recompute it at its next use, when that costs less than moving it
        (`_recompute_plan`), with the dead operands it needs computed again first. Each operand of those
        recomputes gets a use at that step and is held until the recompute."""
        plan = self._recompute_plan(t)
        if plan is None:
            return False
        use = self.uses[t][self.next[t]]
        for x in (t, *plan[1]):
            if x in self.pending:  # a pending recompute due later, advanced to `use`
                self._advance(x, use)
                continue
            self.pending.add(x)
            self.due[x] = use
            for o in self.operands[x]:
                insort(self.uses[o], use, lo=self.next[o])
                self.held[o] += 1
        return True

    def _advance(self, x: int, use: int) -> None:
        """Move pending `x`'s recompute from its due step to `use`: the uses its operands were given then come
        at `use` instead, and a pending operand due later (its dead chain, or a recompute it reads) comes
        at `use` too, since `_recompute` computes it first."""
        due = self.due[x]
        if due <= use:
            return
        self.due[x] = use
        for o in self.operands[x]:
            uses = self.uses[o]
            i = bisect_left(uses, due, lo=self.next[o])
            assert i < len(uses) and uses[i] == due
            del uses[i]
            insort(uses, use, lo=self.next[o])
            if o in self.pending:
                self._advance(o, use)

    def _recompute_plan(self, t: int) -> tuple[float, list[int]] | None:
        """Seconds that recomputing `t` at its next use costs, and the dead tensors it needs computed again
        first, when it is a candidate and that is cheaper than moving it.

        A candidate's producer is a kernel, it is not read by the op being placed (that one comes back
        as a reload this step) nor by a pending recompute. Each operand is on its GPU or in storage, or
        pending and computed again no later than `t` is due, or dead and gone: then computed again first
        (its producer a kernel, its own operands under the same rule, `REMAT_DEPTH` deep at most: the
        layer's normed input behind a large projection). Recomputing costs the kernels' time plus a
        reload of every operand not on the GPU, or on it but not needed again by then (holding it costs
        memory, so it may leave), unless that reload comes anyway a few steps on (`_reload_moves`);
        moving costs the reload, plus the offload when storage holds no copy. None: move it.
        """
        view, uses, k = self.view, self.uses[t], self.next[t]
        if view.ops[t] in ("input", "move") or self.held[t] or k == len(uses) or uses[k] <= self.step:
            return None
        use, d, cost = uses[k], view.devices[t], self.remat
        chain: list[int] = []
        spent = 0.0

        def recomputable(x: int, depth: int) -> bool:
            nonlocal spent
            spent += self._kernel_seconds(x)
            for o in self.operands[x]:
                if view.devices[o] != d:
                    return False
                if o in self.pending:
                    if self._next_use(o) > use:
                        if not REMAT_ADVANCE or self._next_use(o) == NEVER:
                            return False
                        if o not in chain:
                            chain.append(o)  # computed earlier, at `use` (`_advance`): its kernels are paid already
                elif self.gpu[o] < 0 and self.store[o] < 0:  # dead and gone: compute it again first
                    if o in chain:
                        continue
                    if depth == REMAT_DEPTH or view.ops[o] in ("input", "move") or self.next[o] != len(self.uses[o]):
                        return False
                    chain.append(o)
                    if not recomputable(o, depth + 1):
                        return False
                elif (self.gpu[o] < 0 or self._next_use(o) > use) and not self._reload_moves(o, use):
                    spent += self.nbytes[o] / cost.h2d_bw + (self.nbytes[o] / cost.d2h_bw if self.store[o] < 0 else 0.0)
            return True

        if not recomputable(t, 0):
            return None
        saved = self.nbytes[t] / cost.h2d_bw + (self.nbytes[t] / cost.d2h_bw if self.store[t] < 0 else 0.0)
        return (spent, chain) if spent < saved else None

    def _reload_moves(self, o: int, use: int) -> bool:
        """Whether a recompute at step `use` that reads `o` (in storage, not kept on the GPU till then)
        costs no reload of its own: `o` is read again within `NEAR_USE` steps after it, a reload that
        happens anyway and comes earlier (a frozen weight read by the forward's recompute and again by
        its backward's matmul a few steps on)."""
        if self.store[o] < 0:
            return False
        uses = self.uses[o]
        later = bisect_left(uses, use, lo=self.next[o])
        return later < len(uses) and uses[later] - use <= NEAR_USE

    def _recompute(self, t: int) -> None:
        """Compute pending `t` again on its GPU: reload its missing operands, make room, emit its kernel.

        Its operands' uses at this step (added when it was dropped) are spent here, before the op that
        reads `t` runs; the working set is `t`'s own, which fits the budget.
        """
        view, gpu = self.view, self.gpu
        d, operands = view.devices[t], self.operands[t]
        for o in operands:  # dead operands dropped with it, and pending ones due now, first
            if o in self.pending:
                self._recompute(o)
        self._reload_room(d, [o for o in operands if gpu[o] < 0] + [t], operands, t)
        start = self.memory[d].where[t]
        gpu[t] = self._emit("kernel", t, d, loc=(start, view.nbytes[t]), inputs=tuple([gpu[o] for o in view.inputs[t]]))
        self.pending.discard(t)
        for o in operands:
            self.held[o] -= 1
            self.next[o] += 1
            self._drop_if_dead(o)

    def _kernel_seconds(self, t: int) -> float:
        """The cost model's time for `t`'s kernel, computed once per tensor."""
        if t not in self.seconds:
            task, view = self.tasks[t], self.view
            node = MemNode(t, "kernel", task.id, None, None, None, (), (), task.op, task.shape, task.dtype, task.attrs)
            inputs = [MemNode(o, "kernel", view.ids[o], None, None, None, (), (), None, self.tasks[o].shape, self.tasks[o].dtype)
                      for o in view.inputs[t]]
            self.seconds[t] = self.remat.kernel_time(node, inputs)
        return self.seconds[t]

    def _start_in_storage(self, t: int) -> None:
        """An input evicted before anyone read it never needed the GPU: it starts in CPU storage instead."""
        node = self.out.nodes[self.gpu[t]]
        self.unread.discard(node.id)
        node.device, node.loc, node.storage = None, None, self._storage(t)
        self.store[t] = node.id
        self.ringed[t] = False
        self._await(t, True)

    def _storage(self, t: int, reuse: bool = False) -> tuple[int, int]:
        """A region of CPU storage for `t`: for an offload (`reuse`) the free one freed longest ago that
        fits, else new bytes at the top; for an input always new bytes, never written by anything else."""
        size = self.size[t]
        start = self.storage.place_free(size) if reuse else None
        if start is None:
            start = self.storage.grow_for(size, fresh=not reuse)
        self.storage.take(start, size, t)
        return (start, self.view.nbytes[t])

    def _emit(self, op: str, t: int, device, loc=None, storage=None, inputs=()) -> int:
        task = self.tasks[t]
        node_id = len(self.out.nodes)
        kernel = task.op if op == "kernel" else None
        attrs = dict(task.attrs) if op == "kernel" else {}
        self.out.nodes.append(MemNode(node_id, op, task.id, device, loc, storage, inputs, (), kernel, task.shape, task.dtype, attrs))
        return node_id
