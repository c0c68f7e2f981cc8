"""`Session`: a LLaMA model under a per-GPU memory budget that prefills and generates tokens.

State: the config and the weights (each materialised once in the compute dtype, on first use, and kept),
one prepared backend, and a cache of compiled memgraphs keyed by what the graph's shapes depend on (the
kind of graph and its token counts; the config, dtype, budget, GPUs and schedule are fixed per session).
One backend for the session's lifetime: the cpu and cuda backends are made at the first run and every
run loads its memgraph onto them (`execute(..., close=False)`: arenas, streams, workers and libraries are
set up once); `close()` closes it (the sim backend too: it keeps only what a run copies). Every plan
gets the same arena, the budget less the largest cuda workspace any graph of the session has needed so
far, so each fits the prepared arena; a graph that needs a larger workspace shrinks the arena once, which
drops the plans and the backend (they were sized for the old split). So does a plan that pins more host
memory than `arena_budget`'s estimate left GPU page tables for (`refit_arena`): it is compiled again at
the smaller arena. The cuda workspace depends on the attention provider: one named in `backend_options`
(`attention_provider`) is sized and run as named; `auto` takes the first of `auto`'s candidates
(torch-cudnn where torch with CUDA runs) without ranking them: a ranking that took triton cost a 7b
session at 1 GiB 15 s more set-up on the H200 for prefills the sim put 1.3% faster (docs/generation.md).
Generation ([docs/generation.md](../docs/generation.md)): one prefill of every prompt's first P-1 tokens,
packed end to end (chunks of PREFILL_TOKENS), whose k and v rows the runs write straight into the call's
cache; its plan (layer order, token block, query group, schedule) chosen by turnip/choose.py at the
session's arena on the sim and cuda backends, once per arena and prompt lengths, the choice kept on disk
(`_prefill_plan`; `prefill_plan` forces or keeps the defaults); then N decode steps, each one taskgraph
for the whole batch (one new token per sequence: the last prompt token first, then each generated one).
A step's shapes depend only on its cache columns (`DecodeStep.key`: a new plan every `kv_block` tokens
and at each size step of the last column's rows), so most steps run a cached plan. Decode plans are compiled with inputs="recur": the
weights and cache columns that survive a step stay on the GPU for the next, and only what changed is
copied (`execute(..., unchanged=)`, runtime/residency.py). Between steps the KV cache is host numpy
columns shared by the batch (frontend/workloads/llama/kv_cache.py, with room for the new tokens); the new rows each step
returns are written in, and the next token is chosen on the host from the logits (turnip/sampling.py:
greedy takes their argmax as they are, sampling works in float64).
A call that fails raises one `TurnipError` line before or during a run and leaves nothing behind: its
caches are local to the call, and a run that fails closes the backend, so the next run makes a new one.
Weights holding a NaN or an infinity in the compute dtype are refused, naming the tensor, once the run
that first reads them ends (turnip/inputs.py; the check runs on a thread of its own meanwhile:
`Materialized`), and a decode step whose logits hold a NaN ends the call with one line rather than a
token chosen from them.
A session runs one call at a time (`prefill`, `generate`, `finetune`, `close`): a call made while another thread's
call runs raises `InputError` at once, never waits (use a session per thread).
The sim backend computes no values: there generation is timing only (tokens fed back are 0 and `tokens`
is -1; `GenerateResult.computed` is False).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from weakref import WeakKeyDictionary

import numpy as np

from frontend.workloads import llama
from frontend.workloads.llama.decode import KV_BLOCK, DecodeStep, build_decode_step, cache_columns, step_key
from frontend.workloads.llama.kv_cache import KvCache, buffer_rows
from passes.pipeline import compile_taskgraph
from runtime import arena_budget, execute
from runtime.api import refit_arena
from runtime.backends import Backend, make_backend, resolve_backend
from runtime import process_memory
from runtime.callbacks import Recorder
from runtime.summary import RunSummary
from turnip import forks
from turnip.budget import naming_the_budget
from turnip.candidates import DIMENSIONS, Candidate, LlamaPrefill, PlanTarget
from turnip.choice_cache import ChoiceCache, ChoiceCaches, default_cache_dir
from turnip.choose import choose_llama_plan
from turnip.finetune import FinetuneResult, check_computes, finetune
from turnip.host import HostMemory, Materialized, Soon
from turnip.inputs import (MAX_NEW_TOKENS, FolderTokenizer, check_finite_weight, check_gpus, check_prefill_plan, check_seed, check_session_arguments, checked_prompts,
                           forced_tokens, given_cache, given_caches, holds_nonfinite, load_model)
from turnip.lora import Adapter, MergedWeights, adapter_of
from turnip.plans import plan_key, read_plan, write_plan
from turnip.sampling import check_sampling, next_tokens
from turnip.search import PRELOAD
from turnip_ir.cost import CostModel
from turnip_ir.errors import BudgetError, InputError, KernelError
from turnip_ir.kernels import numpy_dtype
from turnip_ir.units import parse_size
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

CACHE_ENTRIES = 256
"""Compiled memgraphs kept per session, least recently used dropped first."""
PREFILL_TOKENS = 65536
"""The most prompt tokens one prefill plan packs: a call with more prefills in chunks, each streaming every
weight once (a 7b plan of 64k tokens compiles in a few seconds)."""
KV_ALIGN = 1 << 12
"""Where each of a call's KV cache buffers starts in the one region that holds them all (`_empty_cache`)."""


def _alike(prefill: LlamaPrefill) -> tuple | None:
    """What a packed prefill shares with those whose choice it may take (`Session._alike_choice`): all but
    its lengths, its token count and its longest prompt each rounded up to a power of two, and how many
    prompts it packs by the same rule; None for one unpacked sequence (chosen for itself)."""
    if prefill.sequences is None:
        return None
    up = lambda n: 1 << (int(n) - 1).bit_length()  # noqa: E731
    return (replace(prefill, tokens=0, sequences=None), up(prefill.tokens), up(max(prefill.sequences)), up(len(prefill.sequences)))


@dataclass(frozen=True)
class PrefillPlan:
    """How a prefill's plan was chosen (`choose_llama_plan`): for `tokens` prompt tokens, the `candidate`,
    `how` (searched, unbound: the budget does not bind, kept: read from the choice cache, or alike: taken
    from a prefill alike in the session), the seconds it took and the sim's makespan of the plan where it
    ran one."""

    tokens: int
    candidate: Candidate
    how: str
    seconds: float
    makespan: float | None = None

    def describe(self) -> str:
        why = {"searched": "searched", "unbound": "the budget does not bind", "kept": "chosen before, kept",
               "alike": "chosen for prompts alike in this session"}.get(self.how, self.how)
        sim = f"; sim {self.makespan:.3f} s" if self.makespan is not None else ""
        return f"{self.candidate.describe()} ({why}, {self.seconds:.2f} s{sim})"


@dataclass
class GenerateResult:
    """The new tokens int64 [B, N], their text, and what the runs cost."""

    tokens: np.ndarray
    text: list[str] | None = None
    """Per prompt, its new tokens' text (special tokens skipped), where the session has a tokenizer (a weights
    folder with tokenizer.json) and computes values; else None."""
    computed: bool = True
    """False on the sim backend: no values, `tokens` is -1."""
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    """Per decode step, its wall time but its compile: the inputs fed, the plan loaded, what is not in
    place yet copied, the run, the outputs read, the new rows appended and the next tokens chosen (on
    the sim: the predicted makespan plus the copies before the run at the cost model's host-to-device
    rate)."""
    step_run_seconds: list[float] = field(default_factory=list)
    """Per decode step, the executor's run alone (the sim's makespan)."""
    compile_seconds: float = 0.0
    compiles: int = 0
    cache_hits: int = 0
    plans_read: int = 0
    """Of the cache hits, plans read from the session's `plan_dir`."""
    bytes_offloaded: int = 0
    bytes_reloaded: int = 0
    bytes_placed: int = 0
    """Input bytes copied onto the GPU before runs (what was not kept from the run before)."""
    bytes_staged: int = 0
    """Input bytes copied into the plans' host storage before runs (on the cuda backend none of the
    weights or cache: they are page-locked where the session keeps them, and read in place)."""
    step_bytes_placed: list[int] = field(default_factory=list)
    """Per decode step, the input bytes copied onto the GPU before its run."""
    peak_arena: int = 0
    prefill_plans: list[PrefillPlan] = field(default_factory=list)
    """The prefill plans this call chose (none where each was chosen before, in the session, or forced)."""
    recorder: Recorder | None = None
    """The last decode step's recorder (its Chrome trace)."""
    logits: list[np.ndarray] = field(default_factory=list)
    """Per decode step the float64 logits [B, vocab], kept under teacher forcing (`generate(forced=...)`)."""
    step_host_seconds: list[dict[str, float]] = field(default_factory=list)
    """Per decode step, its host work outside the run by part: "feed" (the step's inputs and what
    changed in the cache), `execute`'s parts (RunSummary.host_seconds), "append" (the new rows into the
    cache) and "choose" (the next tokens)."""

    device_peak: int | None = None
    """The most device memory this process held on a GPU during the call, as the driver reports it (NVML:
    what nvidia-smi shows), context included; None where the driver cannot say (no GPU)."""
    device_context: int | None = None
    """What the process held on that GPU before its first arena: the CUDA context and the driver's modules."""
    bytes_written_straight: int = 0
    """Output bytes the runs wrote straight into the session's arrays (the prefill's k and v rows into the
    cache, a step's new rows): on cuda from the GPU, with no host copy."""
    bytes_copied_after: int = 0
    """Output bytes copied on the host after a run into the session's arrays (the cpu backend's way)."""
    prepare_seconds: float = 0.0
    """The runs' `prepare` (plans loaded onto the backend: views, pinned storage, kernels built, the inputs
    placed), counted within the prefill's and the steps' seconds."""
    call_seconds: float = 0.0
    """The whole call, from its arguments to its last token (compiles included)."""
    first_token_seconds: float = 0.0
    """From the call's start to its first new tokens (compiles, the prefill and the first step)."""
    began: float = field(default=0.0, repr=False)
    """`time.perf_counter()` when the call began."""
    last_step: RunSummary | None = field(default=None, repr=False, compare=False)
    """The last decode step's run summary (`step_link` reads it)."""

    @property
    def step_link(self) -> tuple[int, float] | None:
        """What a decode step moves over the host link: the last step's bytes copied host to device (its
        reloads, and the inputs placed before its run) and the rate its reloads ran at while the link was
        busy (bytes/s; the cost model's on the sim). None before a step, or where the step reloaded nothing
        or the backend has no link (cpu)."""
        summary = self.last_step
        if summary is None or summary.backend == "cpu" or not summary.bytes_reloaded or summary.h2d_bandwidth <= 0:
            return None
        return summary.bytes_reloaded + summary.bytes_placed, summary.h2d_bandwidth

    @property
    def decode_seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def steps(self) -> int:
        """Decode steps run: fewer than the tokens' columns when every sequence ended early (`stop_at_eos`)."""
        return len(self.step_seconds)

    @property
    def steady_step_seconds(self) -> float:
        """A step once the decode runs: the median of every step but the first (which loads its plan and
        places every weight), or the first when it is the only one."""
        later = self.step_seconds[1:] or self.step_seconds
        return float(np.median(later)) if later else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens of the whole batch per second of decoding (every step)."""
        return len(self.tokens) * self.steps / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def steady_tokens_per_second(self) -> float:
        """New tokens of the whole batch per second at the steady step."""
        return len(self.tokens) / self.steady_step_seconds if self.steady_step_seconds > 0 else 0.0

    @property
    def end_to_end_tokens_per_second(self) -> float:
        """New tokens of the whole batch per second of the whole call (set-up and prefill included)."""
        return self.tokens.size / self.call_seconds if self.call_seconds > 0 else 0.0


def _one_call_at_a_time(method):
    """`method` refused with a one-line `InputError` while another call of the session runs (module docstring)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not self._busy.acquire(blocking=False):
            raise InputError(f"the session is running another call (in another thread), so {method.__name__} cannot start: "
                             "a session runs one call at a time; use a session per thread")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy.release()

    return call


class Session:
    """A model, its weights and a compile cache; `prefill` and `generate` run it under `memory` bytes per GPU."""

    def __init__(self, config: llama.LlamaConfig | str | None = None, weights: Mapping | str | Path | None = None,
                 memory: int = 1 << 30, backend: str = "auto", gpus: int = 1, order: str = "nondet", seed: int = 0,
                 dtype: str | None = None, schedule: str | None = None, kv_block: int = KV_BLOCK, backend_options: Mapping | None = None,
                 plan_dir: str | Path | None = None, adapter: Adapter | str | Path | None = None, prefill_plan: str | Mapping = "auto"):
        """`adapter`: a PEFT LoRA folder or an `Adapter` (turnip/lora.py), merged into the weights as PEFT's
        `merge_and_unload` merges it and checked against the config here (one `InputError` line): the
        session runs the base model with it, through the same graphs and plans as without it.
        `schedule`: every plan's (passes/schedules.py); None: `given` for the decode steps and training,
        the prefills' chosen with their plan. `prefill_plan`: how the prefills' plans are chosen (module
        docstring): `auto`, `default` (the frontend's defaults, no search) or a mapping that forces some of
        layer_order, block, query_group and schedule (`auto` for one: searched, on any backend)."""
        self._busy = threading.Lock()
        """Held while a call runs (`_one_call_at_a_time`)."""
        if isinstance(memory, str):
            memory = parse_size(memory)  # the units --memory takes: "4GiB", "1.5GiB", "100KiB", 1e9
        check_session_arguments(memory, gpus, order, seed, dtype, schedule, kv_block, backend_options, plan_dir)
        self.prefill_plan = check_prefill_plan(prefill_plan)
        """How the prefills' plans are chosen: `auto`, `default` or the dimensions forced."""
        self.backend = resolve_backend(backend)
        self.config, source = load_model(config, weights, seed, dtype, self.backend)
        self.adapter = adapter_of(adapter, self.config)
        """The LoRA adapter merged into the weights, or None."""
        check_gpus(gpus, self.config)
        self.plan_dir = None if plan_dir is None else Path(plan_dir)
        """Where compiled plans are also kept on disk, across sessions and processes (None: memory only)."""
        if self.plan_dir is not None:
            try:
                self.plan_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise InputError(f"plan folder '{self.plan_dir}' cannot be made: {err.strerror or err}") from None
        self.disk_hits = 0
        """Plans read from `plan_dir` instead of compiled."""
        self.prefill_plans: list[PrefillPlan] = []
        """Every prefill plan the session chose (`PrefillPlan`), in order."""
        self.backend_options = dict(backend_options or {})
        """Keyword arguments of the cuda backend's constructor (runtime.backends.make_backend), e.g. queue_depth."""
        self.tokenizer = FolderTokenizer(Path(weights) if isinstance(weights, (str, os.PathLike)) else None)
        """The weights folder's tokenizer: `session.tokenizer()` loads it once (frontend/text.py), or says what is missing."""
        self.memory, self.gpus, self.order, self.seed = int(memory), int(gpus), order, int(seed)
        self.schedule, self.kv_block = schedule or "given", int(kv_block)
        self._forced_schedule = schedule
        """The schedule the caller named (None: the prefills' is chosen)."""
        self.host = HostMemory(self.backend)
        if self.host.pinned and self.prefill_plan != "default":  # a prefill's search forks from a server: started now
            forks.start_server(PRELOAD)
        merged = source if self.adapter is None else MergedWeights(source, self.adapter)
        self.weights = Materialized(merged, self.config.dtype, self.host, check=check_finite_weight)
        if hasattr(source, "lazy"):  # a checkpoint: its files' maps page-locked meanwhile, where read in place
            self.host.lock_soon((merged.lazy(name) for name in merged), numpy_dtype(self.config.dtype))
        self.cache: OrderedDict[tuple, MemGraph] = OrderedDict()
        self.compiles = 0
        self.cache_hits = 0
        self.backends_built = 0
        """Backends made for runs: 1 for a session whose runs all succeed."""
        self.arena = self.memory
        """The arena bytes every plan of the session is compiled under (module docstring)."""
        self._pinned = 0
        """The most page-locked host bytes any call so far was sized for (`_call_pinned`)."""
        self.attention = self.backend_options.get("attention_provider", "auto")
        """The attention provider the arena is sized for and the cuda backend runs; `auto` until the first
        plan resolves it (`_resolve_attention`)."""
        self.closed = False
        self._runs = 0
        self._calls = 0
        self._machine: Backend | None = None
        self._prefills: OrderedDict[tuple, llama.LlamaGraph] = OrderedDict()
        """Prefill graphs built, by (`LlamaPrefill`, `Candidate`) (`_built_prefill`: a call sizes the arena
        with a graph, then runs it)."""
        self._prefill_choices: OrderedDict[LlamaPrefill, Candidate] = OrderedDict()
        """Per prefill, the plan chosen at the current arena (`_prefill_plan`; dropped when it shrinks)."""
        self._training: dict[tuple, tuple] = {}
        """Training steps built, by batch shape and LoRA spec: (the TrainGraph, the frozen weights cut into its
        blocks, what the sim chose of its recompute), kept across `finetune` calls (turnip/finetune.py, `TurnipEngine`)."""
        self._steps: dict[tuple, DecodeStep] = {}
        """Decode steps built, by the columns they read (their graphs are the same for any lengths)."""
        self._placed: dict[str, tuple] = {}
        """What the backend was given in its last run: input id -> the value's identity (`_identities`)."""
        self._call_steps: dict[tuple, dict] = {}
        """Per decode step graph (`DecodeStep.key`), what the current call reads of it again and again
        (`_call_step`: its cache inputs by column, their identities, the cache's column views); dropped
        when the call ends, so the call's cache is not kept alive."""
        self._weight_inputs: WeakKeyDictionary = WeakKeyDictionary()
        """Taskgraph -> its weight inputs' identities (`_identities`), read once per graph."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @_one_call_at_a_time
    def close(self) -> None:
        """Close the backend, free the weights and the compiled plans; later calls are a one-line error. Idempotent."""
        self.closed = True
        self._drop_backend()
        self.cache.clear()
        self._steps.clear()
        self._prefills.clear()
        self._prefill_choices.clear()
        self._training.clear()  # its weight blocks are views of the weights freed next
        self.weights.close()
        self.weights = Materialized({}, self.config.dtype, self.host)
        self.host.release()

    # ----- calls ------------------------------------------------------------------------------------
    @_one_call_at_a_time
    def prefill(self, ids) -> np.ndarray:
        """The final hidden states [T, hidden] of one prompt (as `turnip llama`), computed backends only."""
        self._check_open()
        if self.backend == "sim":
            raise InputError("the sim backend computes no values, so prefill needs a backend that computes")
        ids = checked_prompts([ids], self.config)[0]
        prefill = LlamaPrefill(self.config, len(ids), self.gpus, self._placement())
        stats = GenerateResult(np.empty(0))
        with self._budget_of(lambda: [self._prefill_graph(prefill).graph], "this prefill"):
            built, memgraph = self._prefill_plan(prefill, stats)
            result, _, _ = self._run(None, built.graph, built.feed(self.weights, ids), stats, memgraph=memgraph)
        return built.gather(result.outputs)

    @_one_call_at_a_time
    def generate(self, prompts: Sequence, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, stop_at_eos: bool = False, forced=None, caches=None, on_step=None) -> GenerateResult:
        """`max_new_tokens` new tokens for each prompt (1-D int arrays, ragged allowed), as int64 [B, N].

        A prompt may be text or a conversation (a list of {"role", "content"} messages) too, tokenized with
        the weights folder's tokenizer (turnip/inputs.py `checked_prompts`); `GenerateResult.text` is then
        the new tokens' text. `on_step(step, tokens)` is called after each decode step with its chosen
        tokens int64 [B] (to stream them).

        With `stop_at_eos`, a sequence that has emitted an end-of-sequence id (the config's) emits that id
        from then on (it is still computed: the batch keeps its shape). Teacher forcing: `forced`, int
        [B, N], is fed (and returned) instead of the chosen tokens, and each step's logits are kept in
        `GenerateResult.logits`, to compare two implementations step by step. `caches` skips the prefill:
        per prompt, per layer (k, v), each [P-1, kv_heads * head_dim] (what the prefill of all but the
        prompt's last token would give; benchmarks pass random ones), or a `KvCache` (`KvCache.wrap` over
        the caller's token-major buffers, which the steps then read and write in place: no copy)."""
        self._check_open()
        began = time.perf_counter()
        held = self._device_memory()
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if max_new_tokens > MAX_NEW_TOKENS:
            raise InputError(f"max_new_tokens must be at most {MAX_NEW_TOKENS}, got {max_new_tokens}")
        check_sampling(temperature, top_p)
        if seed is not None:
            check_seed(seed)
        if not isinstance(stop_at_eos, (bool, np.bool_)):
            raise InputError(f"stop_at_eos must be True or False, got {stop_at_eos!r}")
        if stop_at_eos and not self.config.eos_token_id:
            raise InputError("stop_at_eos (--stop-at-eos) needs an end-of-sequence id, and the model names none "
                             "(eos_token_id in its config.json or generation_config.json)")
        prompts = checked_prompts(prompts, self.config, self.tokenizer)
        forced = None if forced is None else forced_tokens(forced, len(prompts), int(max_new_tokens), self.config)
        stats = GenerateResult(np.full((len(prompts), int(max_new_tokens)), -1, dtype=np.int64), computed=self.backend != "sim", began=began)
        graphs = partial(self._graphs_of_call, prompts, int(max_new_tokens), caches is None)
        with self._budget_of(graphs, "this generate (its prefills and every decode step)"):
            if isinstance(caches, KvCache):  # the caller's buffers, written in place
                cache = given_cache(caches, prompts, int(max_new_tokens), self.config, self.kv_block)
                self._size_arena(prompts, int(max_new_tokens), prefill=False)
            else:
                caches = None if caches is None else given_caches(caches, prompts, self.config)
                pending = self._pinning(prompts, int(max_new_tokens), stats) if caches is None else None
                self._size_arena(prompts, int(max_new_tokens), prefill=caches is None)
                if caches is None:
                    cache = self._prefill(prompts, int(max_new_tokens), stats, pending)
                else:
                    cache = self._new_cache(caches, prompts, int(max_new_tokens), stats.computed)
            self._calls += 1  # the cache's rows are new: no column of an earlier call is kept
            rng = np.random.default_rng(self.seed if seed is None else seed)
            current = np.array([p[-1] for p in prompts], dtype=np.int64)
            try:
                self._steps_of_call(stats, cache, current, forced, temperature, top_p, rng, stop_at_eos, int(max_new_tokens), on_step)
            finally:
                self._call_steps = {}
        stats.text = self.tokenizer.decoded(stats.tokens) if stats.computed else None
        stats.call_seconds = time.perf_counter() - began
        stats.device_peak, stats.device_context = self._device_peak(held)
        return stats

    def _budget_of(self, graphs, what: str):
        """A budget error inside as the budget `what` needs in all (turnip/budget.py): `graphs()` are its graphs,
        with the page tables of what the call was sized to pin (`_size_arena`)."""
        return naming_the_budget(self.memory, graphs, self.backend, what, self.attention, pinned=lambda: self._pinned or None)

    def _graphs_of_call(self, prompts: list[np.ndarray], steps: int, prefills: bool) -> list[TaskGraph]:
        """Every graph a generate runs: its packed prefills (`_prefill_chunks`) when `prefills`, and each
        distinct decode step (`_call_decode_steps`); built once, kept for the runs."""
        graphs = [step.graph for step in self._call_decode_steps(prompts, steps)]
        if prefills:
            graphs += [self._prefill_graph(self._packed(prompts, chunk)).graph for chunk in self._prefill_chunks(prompts)]
        return graphs

    @_one_call_at_a_time
    def finetune(self, data, steps: int, **options) -> FinetuneResult:
        """`steps` LoRA fine-tuning steps of the model over `data` under the session's budget, on its backend:
        the per-step losses (`FinetuneResult.losses`) and the adapter (`.adapter`, with `.files(folder, .state)`
        for a PEFT folder). The data, the adapter to start from and the optimizer's options are turnip/finetune.py
        `finetune`'s keywords (lr, weight_decay, warmup_steps, batch, grad_accum, seq_len, rank, alpha, targets, ...)."""
        self._check_open()
        if options.get("engine") is None:  # Turnip's own engine computes on the session's backend
            check_computes(self.backend)
        held = self._device_memory()
        result = finetune(self, data, steps, **options)
        result.device_peak, result.device_context = self._device_peak(held)
        return result

    def _device_memory(self):
        """This process's device memory on the cuda backend, its peak reset for a call (None elsewhere)."""
        held = process_memory.current() if self.backend == "cuda" else None
        if held is not None:
            held.reset()
        return held

    def _device_peak(self, held) -> tuple[int | None, int | None]:
        """The call's peak device memory and the CUDA context's, as the driver reports them (None: it cannot).
        `held` is None where no monitor was there when the call began: a process's first call, whose backend
        made the monitor (before its first arena: its peak since then is the call's)."""
        if held is None and self.backend == "cuda":
            held = process_memory.current()
        if held is None or not held.available:
            return None, None
        return max(held.peak()), max(held.context_bytes)

    def _steps_of_call(self, stats: GenerateResult, cache: KvCache, current: np.ndarray, forced, temperature: float, top_p: float,
                       rng, stop_at_eos: bool, max_new_tokens: int, on_step=None) -> None:
        """`generate`'s decode steps, filling `stats`."""
        finished = np.zeros(len(current), dtype=bool)
        kept = None  # the teacher-forced steps' logits
        for step in range(max_new_tokens):
            began, compiled = time.perf_counter(), stats.compile_seconds
            logits = self._decode(current, cache, stats)
            if not stats.computed:
                current[:] = 0
                continue
            if holds_nonfinite(logits, nan_only=True):
                rows = np.flatnonzero(np.isnan(np.asarray(logits, np.float32)).any(axis=1)).tolist()
                raise KernelError(f"decode step {step}: the logits of prompt(s) {rows} hold NaN (the computation overflowed in "
                                  f"{self.config.dtype}, or the config's numbers are off); no tokens are returned")
            chose = time.perf_counter()
            if forced is not None:  # kept as they came (a copy: the backend reuses that memory), widened after the loop
                if kept is None:  # every step's room at once, its pages touched now: no page faults in later steps
                    kept = np.empty((max_new_tokens, *np.shape(logits)), np.asarray(logits).dtype)
                    kept.fill(0)
                kept[step] = logits
                chosen = forced[:, step]
            else:
                chosen = next_tokens(logits, temperature, top_p, rng)
            if stop_at_eos:
                chosen = np.where(finished, current, chosen)
                finished |= np.isin(chosen, self.config.eos_token_id)
            stats.tokens[:, step] = current = chosen
            stats.step_host_seconds[-1]["choose"] = time.perf_counter() - chose
            stats.step_seconds.append(time.perf_counter() - began - (stats.compile_seconds - compiled))
            if step == 0:
                stats.first_token_seconds = time.perf_counter() - stats.began
            if on_step is not None:  # after the step's time is taken: what the caller does is not the step's
                on_step(step, stats.tokens[:, step].copy())
            if stop_at_eos and finished.all():  # every sequence has ended: the rest is its end id, not computed
                stats.tokens[:, step + 1:] = current[:, None]
                break
        if kept is not None:
            stats.logits = [np.asarray(logits, dtype=np.float64) for logits in kept]

    # ----- steps --------------------------------------------------------------------------------------
    def _prefill(self, prompts: list[np.ndarray], steps: int, stats: GenerateResult, pending: Soon | None = None) -> KvCache:
        """The call's KV cache after every prompt's first P-1 tokens, with room for `steps` more: the prompts
        prefilled together, packed end to end (frontend/workloads/llama/graph.py, `sequences`) in chunks of
        at most PREFILL_TOKENS (`_prefill_chunks`), so each chunk streams every weight once, not every prompt;
        the runs write their k and v rows straight into the cache the steps read (`execute(outputs_into=)`
        pieces: from the GPU on cuda, no host copy). On the sim, which computes nothing, only lengths.
        `pending`: the cache, being page-locked since the call began (`_pinning`)."""
        cache = None if pending is not None else self._empty_cache(prompts, steps, stats.computed)
        for chunk in self._prefill_chunks(prompts):
            built, memgraph = self._prefill_plan(self._packed(prompts, chunk), stats)  # while the cache is page-locked
            inputs = into = None
            if stats.computed:
                inputs = built.feed(self.weights, np.concatenate([prompts[b][:-1] for b in chunk]))
                cache = cache if cache is not None else pending.result()
                into = {task: [(piece.row_start, piece.row_stop, cache.rows(piece.layer, piece.kind, chunk[piece.sequence], piece.first_position,
                                                                           piece.first_position + piece.row_stop - piece.row_start, piece.columns))
                               for piece in pieces] for task, pieces in built.kv_pieces().items()}
            _, seconds, _ = self._run(None, built.graph, inputs, stats, into=into, memgraph=memgraph)
            stats.prefill_seconds += seconds
        cache = cache if cache is not None else pending.result()
        cache.filled([len(p) - 1 for p in prompts])
        return cache

    def _pinning(self, prompts: list[np.ndarray], steps: int, stats: GenerateResult) -> Soon | None:
        """The call's empty cache being page-locked on a thread of its own (`HostMemory.soon`), begun before
        the call sizes its arena (which imports torch and builds the call's graphs) and compiles or reads its
        plans: a 7b batch's 17 GB take 2.2 s. None where nothing is page-locked (`_prefill` makes the cache
        itself)."""
        return self.host.soon("cache pinning", self._empty_cache, prompts, steps, stats.computed) if self.host.pinned and stats.computed else None

    def _prefill_chunks(self, prompts: list[np.ndarray]) -> list[list[int]]:
        """The prompts with something to prefill (P > 1), by index, in consecutive chunks of at most
        PREFILL_TOKENS prefilled tokens (a longer prompt alone)."""
        chunks: list[list[int]] = []
        total = 0
        for b, prompt in enumerate(prompts):
            n = len(prompt) - 1
            if n == 0:
                continue
            if not chunks or total + n > PREFILL_TOKENS:
                chunks.append([])
                total = 0
            chunks[-1].append(b)
            total += n
        return chunks

    def _packed(self, prompts: list[np.ndarray], chunk: list[int]) -> LlamaPrefill:
        """The packed prefill of `chunk`'s prompts but their last tokens: k and v out, no hidden states."""
        lengths = tuple(len(prompts[b]) - 1 for b in chunk)
        return LlamaPrefill(self.config, sum(lengths), self.gpus, self._placement(), kv_outputs=True, sequences=lengths, hidden=False)

    def _prefill_graph(self, prefill: LlamaPrefill) -> llama.LlamaGraph:
        """`prefill`'s graph as chosen at the current arena, or before a choice its first candidate (the
        defaults and what is forced): a call sizes its arena with that one, then chooses."""
        return self._built_prefill(prefill, self._prefill_choices.get(prefill) or prefill.start(self._prefill_given()))

    def _built_prefill(self, prefill: LlamaPrefill, candidate: Candidate, built: llama.LlamaGraph | None = None) -> llama.LlamaGraph:
        """`prefill`'s graph under `candidate` (`built`, where the choice built it), built once and kept."""
        key = (prefill, candidate)
        if key in self._prefills:
            self._prefills.move_to_end(key)
            return self._prefills[key]
        built = self._prefills[key] = built or prefill.build(candidate)
        if len(self._prefills) > CACHE_ENTRIES:
            self._prefills.popitem(last=False)
        return built

    def _prefill_given(self) -> dict[str, object]:
        """What `choose_llama_plan` is given for a prefill: `prefill_plan`'s forced dimensions, the session's
        schedule where named, and on the cpu backend (which the sim does not predict) or for `default` the
        frontend's defaults (None) for the rest."""
        plan = self.prefill_plan
        given: dict[str, object] = dict(plan) if isinstance(plan, Mapping) else {}
        if self._forced_schedule is not None:
            given.setdefault("schedule", self._forced_schedule)
        if plan == "default" or self.backend == "cpu":
            given = {name: given.get(name) for name in DIMENSIONS}
        return given

    def _prefill_plan(self, prefill: LlamaPrefill, stats: GenerateResult) -> tuple[llama.LlamaGraph, MemGraph]:
        """`prefill`'s graph and plan at the session's arena: the plan chosen once per arena (module
        docstring), then cached as every plan is (`_compiled`)."""
        candidate = self._prefill_choices.get(prefill)
        if candidate is None:
            given = self._prefill_given()
            candidate = prefill.start(given)
            if any(given.get(name, "auto") == "auto" for name in DIMENSIONS):
                chosen = self._alike_choice(prefill) or self._choose_prefill(prefill, given, candidate, stats)
                stats.prefill_plans.append(chosen)
                self.prefill_plans.append(chosen)
                candidate = chosen.candidate
            self._prefill_choices[prefill] = candidate
            if len(self._prefill_choices) > CACHE_ENTRIES:
                self._prefill_choices.popitem(last=False)
        built = self._built_prefill(prefill, candidate)
        return built, self._compiled(("prefill", prefill, candidate), built.graph, stats, schedule=candidate.schedule)

    def _target(self) -> PlanTarget:
        """What a prefill's plan is chosen for: the session's arena, within its budget (turnip/candidates.py)."""
        return PlanTarget(self.memory, self.backend, self.attention, arena=self.arena, pinned=self._pinned or None)

    def _alike_choice(self, prefill: LlamaPrefill) -> PrefillPlan | None:
        """The choice made at this arena for the latest prefill alike (`_alike`: as many tokens and as long a
        prompt, each to within a power of two), its block clamped to the tokens and its query group to the
        blocks; None where none was made. A call's prompt lengths rarely repeat (a server's), and a search
        per new set of lengths would cost more than the plan it finds gains (docs/generation.md)."""
        alike = _alike(prefill)
        for seen, candidate in reversed(self._prefill_choices.items()):
            if seen.sequences is not None and _alike(seen) == alike:
                block = min(candidate.block, prefill.tokens)
                candidate = replace(candidate, block=block, query_group=min(candidate.query_group, -(-prefill.tokens // block)))
                try:  # its workspace leaves the arena the backend is prepared for, as a searched candidate's must
                    self._target().arena_of(self._built_prefill(prefill, candidate).graph)
                except BudgetError:
                    return None
                return PrefillPlan(prefill.tokens, candidate, "alike", 0.0)
        return None

    def _choose_prefill(self, prefill: LlamaPrefill, given: dict, start: Candidate, stats: GenerateResult) -> PrefillPlan:
        """The plan `choose_llama_plan` chooses for `prefill` at the session's arena, its seconds counted as
        compile time (the call's set-up): only candidates whose workspace the arena leaves room for (the
        backend is prepared for it), searched in processes forked from a server where this one holds
        page-locked memory (turnip/forks.py). Its plan goes into the cache unless it pins more host memory
        than the arena left page tables for (`_compiled` then plans it again at a smaller arena)."""
        began = time.perf_counter()
        self._fit_arena(self._built_prefill(prefill, start).graph)  # the first candidate sizes the arena, as any graph does
        target = self._target()
        cache = ChoiceCache(default_cache_dir() / "choices")
        if self.plan_dir is not None:
            cache = ChoiceCaches(ChoiceCache(self.plan_dir), cache)
        choice = choose_llama_plan(prefill, target, given, cache=cache, plan_dir=self.plan_dir,
                                   processes="forkserver" if self.host.pinned else "fork")
        self._built_prefill(prefill, choice.candidate, choice.built)
        if self._smaller_arena(choice.memgraph, choice.built.graph) is None:
            self._keep(self._cache_key(("prefill", prefill, choice.candidate)), choice.memgraph)
            self._count_plan(stats, read=choice.plan_read)
        seconds = time.perf_counter() - began
        stats.compile_seconds += seconds
        return PrefillPlan(prefill.tokens, choice.candidate, choice.how, seconds, choice.makespan)

    def _empty_cache(self, prompts: list[np.ndarray], steps: int, computed: bool) -> KvCache:
        """The call's cache, holding nothing yet, with room for every prompt and `steps` more tokens, in the
        session's lasting host memory (a later call reuses the bytes: `HostMemory.lasting`). Its rows are
        not zeroed: the prefill writes every row a step reads before it reads it (rows past a sequence's
        length are never read). On the sim, only lengths (it computes no rows)."""
        c = self.config
        capacity = max(len(p) for p in prompts) - 1 + steps
        if not computed:
            return KvCache(c.num_hidden_layers, len(prompts), 0, self.kv_block, capacity, c.dtype)
        kv_width = c.num_key_value_heads * c.head_dim
        rows = buffer_rows(capacity, self.kv_block)  # KvCache's buffers: [rows, B, kv_width] each
        each = -(-rows * len(prompts) * kv_width * numpy_dtype(c.dtype).itemsize // KV_ALIGN) * KV_ALIGN
        # one region for every buffer: page-locked at once (one registration, one set of touching threads),
        # not 2 x layers times; each buffer starts on a KV_ALIGN boundary
        region = self.host.lasting("kv", (2 * c.num_hidden_layers * each,), np.uint8)
        starts = iter(range(0, region.nbytes, each))  # the cache's buffers, in the order KvCache makes them

        def buffer(shape, dtype):
            start = next(starts)
            return region[start : start + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

        return KvCache(c.num_hidden_layers, len(prompts), kv_width, self.kv_block, capacity, c.dtype, buffer)

    def _new_cache(self, caches: list, prompts: list[np.ndarray], steps: int, computed: bool) -> KvCache:
        """The call's cache from per-prompt prefixes; on the sim only lengths (it computes no rows)."""
        if computed:
            return KvCache.from_prefixes(caches, self.kv_block, steps, self.config.dtype, self.host.zeros)
        cache = self._empty_cache(prompts, steps, computed)
        cache.filled([len(p) - 1 for p in prompts])
        return cache

    def _decode(self, tokens: np.ndarray, cache: KvCache, stats: GenerateResult) -> np.ndarray | None:
        """One decode step of the batch; appends the new k and v rows to `cache`; the logits [B, vocab] in the
        model's dtype (its head's blocks put side by side: one small copy)."""
        began = time.perf_counter()
        step = self._step([int(n) for n in cache.lengths])
        inputs = self._decode_inputs(step, tokens, cache) if stats.computed else None
        # a column is the same input while the step reads as many of its rows; the rows written since the
        # last run are copied again (refresh) where the column is still in place
        facts = self._call_step(step)
        by_column, identities = facts["by_column"], facts["identities"]
        refresh, partial = {}, {}
        longest = max(step.cache_lengths)
        for (j, rows), names in by_column.items():
            written = cache.written(j, rows) if j in cache.dirty else None
            if written:  # every layer's column j was written in the same rows
                refresh.update(dict.fromkeys(names, written))
            if longest - j * self.kv_block < rows:  # the last column: its rows past the longest sequence are never read
                partial.update(dict.fromkeys(names, longest - j * self.kv_block))
        # the new rows go straight into the cache when they lie together (every sequence as long)
        rows = cache.next_rows() if stats.computed else None
        into = None if rows is None else {name: row for l, pair in enumerate(rows) for name, row in zip(step.new_kv_names(l), pair)}
        fed = time.perf_counter()
        result, seconds, whole = self._run(("decode", step.key), step.graph, inputs, stats, recur=True, identities=identities,
                                           refresh=refresh, partial=partial, into=into)
        ran = time.perf_counter()
        cache.settle()
        stats.step_run_seconds.append(seconds)
        stats.step_bytes_placed.append(result.summary.bytes_placed)
        stats.recorder, stats.last_step = result.recorder, result.summary
        if not stats.computed:
            stats.step_seconds.append(whole)  # the sim's clock (generate times the others whole)
            cache.append(None)  # rows without values: the sim computes none
            return None
        if into is None:
            cache.append(step.new_kv(result.outputs))
        else:
            cache.appended()
        executed = result.summary.host_seconds
        stats.step_host_seconds.append({"feed": fed - began, "session": ran - fed - sum(executed.values()) - result.summary.wall_time,
                                        **executed, "append": time.perf_counter() - ran})
        return step.logits(result.outputs, dtype=None)

    def _call_step(self, step: DecodeStep) -> dict:
        """What the current call reads of `step`'s graph at every step of it (`_call_steps`): its cache
        inputs by (column, rows) and their identities in this call (`_run`); `_decode_inputs` adds the
        cache's column views."""
        facts = self._call_steps.get(step.key)
        if facts is None:
            by_column: dict[tuple[int, int], list[str]] = {}
            for name, (_, _, j, rows) in step.cache_inputs().items():
                by_column.setdefault((j, rows), []).append(name)
            identities = {name: ("kv", self._calls, j, rows) for (j, rows), names in by_column.items() for name in names}
            facts = self._call_steps[step.key] = {"by_column": by_column, "identities": identities}
        return facts

    def _step(self, lengths: list[int]) -> DecodeStep:
        """The decode step for these cache lengths: the step built for their columns before, re-aimed at the
        lengths (its graph depends only on the columns), or a new one."""
        key = step_key(len(lengths), self.kv_block, cache_columns(lengths, self.kv_block, self.config.sliding_window))
        built = self._steps.get(key)
        if built is None:
            built = self._steps[key] = build_decode_step(self.config, lengths, self.gpus, self.kv_block)
            self._weight_inputs[built.graph] = dict.fromkeys(built.weight_ids(), ("weight",))  # the LM head's blocks among them
            if len(self._steps) > CACHE_ENTRIES:
                self._steps.pop(next(iter(self._steps)))
        return replace(built, cache_lengths=tuple(lengths))

    def _decode_inputs(self, step: DecodeStep, tokens: np.ndarray, cache: KvCache) -> dict[str, np.ndarray]:
        hidden = llama.embed(self.weights, tokens, self.config)
        facts = self._call_step(step)
        if "columns" not in facts:
            facts["columns"] = step.column_inputs(cache)
        return step.feed(self.weights, hidden, cache, fixed_weights=True, columns=facts["columns"])

    def _run(self, key: tuple, graph: TaskGraph, inputs, stats: GenerateResult, recur: bool = False, identities=None, refresh=None,
             partial=None, into=None, memgraph: MemGraph | None = None, remat: bool = False, start_on_gpu: frozenset[str] | None = None):
        """Compile `graph` (or take the cached plan for `key`) and run it once; adds its bytes to `stats`;
        the result, the run's seconds (the sim's predicted makespan, else the wall time of the loop) and
        the whole call's but the compile (the sim: the makespan plus the copies before the run).

        `recur`: the graph runs again and again (a decode step): it is planned with inputs="recur", so
        the inputs that survive a run stay on the GPU for the next. Inputs whose value is the one the
        backend had in its last run are not copied again (`unchanged`): the weights always, a cache
        block when `identities` (input id -> what identifies its rows) names the same rows of the same call,
        but for the rows `refresh` names (input id -> rows written since the last run), copied again.
        `partial`: inputs whose leading rows alone are read (input id -> rows; the cache's last column,
        filled only so far): only those are placed and reloaded (runtime.execute). `into`: outputs
        written into the caller's arrays (`execute(outputs_into=)`: the new cache rows). `remat`: the plan
        may recompute an evicted tensor instead of moving it (a training step's activations).
        `start_on_gpu`: the plan starts every input in host storage (the weights stay in their pinned
        memory and stream in, nothing placed before a run) but these, which start on the GPU (a training
        step's batch: planned with inputs="host", as `compile_taskgraph`'s `start_on_gpu`)."""
        if memgraph is None:  # `memgraph`: the caller compiled (or took) it already
            where = "host" if start_on_gpu is not None else "recur" if recur else "gpu"
            memgraph = self._compiled(key, graph, stats, where, remat, start_on_gpu or frozenset())
        self._runs += 1
        current = self._identities(graph, identities or {})
        refresh = refresh or {}
        # the inputs with the same identity as in the last run (all of them when a plan runs again)
        same = current.keys() if current == self._placed else {name for name, _ in current.items() & self._placed.items()}
        unchanged = same - refresh.keys()
        rows = {name: refresh[name] for name in same & refresh.keys()}
        self._placed = {}  # until the run succeeds, what the backend holds is unknown
        began = time.perf_counter()
        try:
            # verify=False: compile_taskgraph proved the plan race-free when it was made; a cached plan runs again
            result = execute(memgraph, backend=self._backend(), order=self.order, seed=self.seed + self._runs, inputs=inputs,
                             close=False, verify=False, unchanged=unchanged, refresh=rows, partial=partial,
                             copy_outputs=not recur, outputs_into=into)  # a decode step's outputs are used at once (appended, sampled)
        except BaseException:
            self._machine = None  # execute closed it: its state after a failure is unknown
            raise
        self.weights.verified()  # the weights' checks (on a thread of their own meanwhile) before a result is used
        summary = result.summary
        self._placed = current
        stats.bytes_offloaded += summary.bytes_offloaded
        stats.bytes_reloaded += summary.bytes_reloaded
        stats.bytes_placed += summary.bytes_placed
        stats.bytes_staged += summary.bytes_staged
        stats.prepare_seconds += summary.prepare_time
        stats.bytes_written_straight += summary.bytes_written_straight
        stats.bytes_copied_after += summary.bytes_copied_after
        stats.peak_arena = max([stats.peak_arena, *summary.arena_high_water])
        if self.backend == "sim":
            return result, summary.makespan, summary.makespan + summary.bytes_placed / CostModel().h2d_bw
        return result, summary.wall_time, time.perf_counter() - began

    def _identities(self, graph: TaskGraph, identities: Mapping[str, tuple]) -> dict[str, tuple]:
        """What identifies each input's value across runs: a weight by its name (a session's weights never
        change), a cache block by `identities`; the step's embeddings and RoPE rows have none (always new)."""
        weights = self._weight_inputs.get(graph)
        if weights is None:
            weights = self._weight_inputs[graph] = {node.id: ("weight",) for node in graph.nodes.values()
                                                     if node.op == "input" and node.id in self.weights}
        return {**weights, **{name: identity for name, identity in identities.items() if name in graph.nodes}}

    @staticmethod
    def _cache_key(key: tuple, inputs: str = "gpu", remat: bool = False, start_on_gpu: frozenset[str] = frozenset()) -> tuple:
        """The `cache` key of a caller's plan `key` compiled with these `_compiled` options."""
        return (*key, inputs, remat, start_on_gpu)

    def _compiled(self, key: tuple, graph: TaskGraph, stats: GenerateResult, inputs: str = "gpu", remat: bool = False,
                  start_on_gpu: frozenset[str] = frozenset(), schedule: str | None = None) -> MemGraph:
        """`graph`'s plan (`key`: what its shapes depend on, and `schedule` where it is not the session's) at
        the session's arena, from the cache or else `_plan`'s."""
        key = self._cache_key(key, inputs, remat, start_on_gpu)
        if key in self.cache:
            self.cache.move_to_end(key)
            self.cache_hits += 1
            stats.cache_hits += 1
            return self.cache[key]
        began = time.perf_counter()
        self._fit_arena(graph, remat)
        memgraph = self._plan(graph, inputs, stats, remat, start_on_gpu, schedule)
        smaller = self._smaller_arena(memgraph, graph)
        if smaller is not None:
            self._shrink_arena(smaller)
            memgraph = self._plan(graph, inputs, stats, remat, start_on_gpu, schedule)
        stats.compile_seconds += time.perf_counter() - began
        self._keep(key, memgraph)
        return memgraph

    def _keep(self, key: tuple, memgraph: MemGraph) -> None:
        """`memgraph` into the plan cache under `key` (a `_cache_key`), the least recently used dropped."""
        self.cache[key] = memgraph
        if len(self.cache) > CACHE_ENTRIES:
            self.cache.popitem(last=False)

    def _smaller_arena(self, memgraph: MemGraph, graph: TaskGraph) -> int | None:
        """The smaller arena `graph` must be planned again at when `memgraph` pins more host memory than the
        arena's estimate left page tables for (`refit_arena`); None when it fits the session's arena."""
        smaller = refit_arena(memgraph, graph, self.memory, self.backend, attention=self.attention)
        return smaller if smaller is not None and smaller < self.arena else None

    def _count_plan(self, stats: GenerateResult, read: bool) -> None:
        """A plan made for a call, in the session's counts and the call's: read from the plan folder (a
        cache hit), or compiled."""
        if read:
            self.disk_hits += 1
            stats.cache_hits += 1
            stats.plans_read += 1
        else:
            self.compiles += 1
            stats.compiles += 1

    def _plan(self, graph: TaskGraph, inputs: str, stats: GenerateResult, remat: bool = False,
              start_on_gpu: frozenset[str] = frozenset(), schedule: str | None = None) -> MemGraph:
        """`graph`'s plan at the session's arena: from the plan folder, or compiled (and written there); with
        `remat`, kept apart from the plans without it (as `choice_cache.plan_path` keeps them)."""
        # a recurring plan starts the inputs the backend holds now where they are, when it can
        kept = self._machine.held().gpu if inputs == "recur" and self._machine is not None else None
        schedule = schedule or self.schedule
        named = f"{schedule} remat" if remat else schedule
        path = None if self.plan_dir is None else self.plan_dir / f"{plan_key(graph, self.arena, named, inputs, kept, start_on_gpu)}.json"
        memgraph = read_plan(path, graph, self.arena) if path is not None else None
        if memgraph is not None:
            self._count_plan(stats, read=True)
            return memgraph
        memgraph = compile_taskgraph(graph, self.arena, schedule, inputs=inputs, kept=kept, remat=remat, start_on_gpu=start_on_gpu)
        if path is not None:
            write_plan(path, memgraph)
        self._count_plan(stats, read=False)
        return memgraph

    def _fit_arena(self, graph: TaskGraph, remat: bool = False) -> None:
        """Shrink the session's arena when `graph` needs a larger workspace than any graph before: every
        plan then gets the smaller arena, and the plans and backend made for the larger one go. The first
        graph of a cuda session with `auto` attention resolves the provider first."""
        if self.attention == "auto" and self.backend == "cuda":
            self._resolve_attention()
        # none known before a call: the graph's own estimate (with recompute, a training step's: its
        # activations' offloads pin far more than its inputs, which left every step planned twice)
        arena = arena_budget(graph, self.memory, self.backend, attention=self.attention, pinned=self._pinned or None, remat=remat)
        if arena < self.arena:
            self._shrink_arena(arena)

    def _resolve_attention(self) -> None:
        """`auto`'s first candidate, unranked (module docstring), for the arena and the backend."""
        from runtime.backends.cuda import CudaBackend

        self.attention = CudaBackend.attention_candidates("auto")[0]
        self.backend_options["attention_provider"] = self.attention

    def _shrink_arena(self, arena: int) -> None:
        """Every plan from now on gets `arena`; the plans, prefill choices and backend made for the larger one go."""
        self.arena = arena
        self.cache.clear()
        self._prefill_choices.clear()
        self._drop_backend()

    def _size_arena(self, prompts: list[np.ndarray], steps: int, prefill: bool) -> None:
        """Size the arena once for a call, before its first run (cuda): the budget less the largest workspace
        of any graph the call runs (its prefill when `prefill`, every decode step) and the GPU page tables
        of what the session pins meanwhile (`_call_pinned`). The arena only shrinks, so a call whose graphs
        the session has seen keeps its backend and plans; a smaller one drops them first (a dropped backend
        returns its memory before the next is made), once, not graph by graph as the call goes."""
        if self.backend != "cuda":
            return
        self._pinned = max(self._pinned, self._call_pinned(prompts, steps))
        for graph in self._graphs_of_call(prompts, steps, prefill):
            self._fit_arena(graph)

    def _call_decode_steps(self, prompts: list[np.ndarray], steps: int) -> list[DecodeStep]:
        """Every distinct decode step a call of `steps` new tokens from `prompts` runs (built once: the
        steps reuse them)."""
        lengths = np.array([len(p) - 1 for p in prompts], dtype=np.int64)
        seen, built = set(), []
        for step in range(steps):
            now = [int(n) for n in lengths + step]
            key = step_key(len(now), self.kv_block, cache_columns(now, self.kv_block, self.config.sliding_window))
            if key not in seen:
                seen.add(key)
                built.append(self._step(now))
        return built

    def _call_pinned(self, prompts: list[np.ndarray], steps: int) -> int:
        """The most page-locked host memory the session may hold during a call: its weights, the call's KV
        cache, as much again for the prefills' k and v outputs in the plans' storage, and an eighth more
        for what plans offload (an estimate made generous: its page tables take 2 MiB of arena per GiB)."""
        c = self.config
        item = np.dtype(numpy_dtype(c.dtype)).itemsize
        weights = sum(int(np.prod(shape, dtype=np.int64)) for shape in llama.weight_shapes(c).values()) * item
        rows = buffer_rows(max(len(p) for p in prompts) - 1 + steps, self.kv_block)
        cache = 2 * c.num_hidden_layers * rows * len(prompts) * c.num_key_value_heads * c.head_dim * item
        pinned = weights + 2 * cache
        return pinned + pinned // 8

    def _backend(self) -> Backend | str:
        """The session's prepared backend (made at the first run, and after a failed one)."""
        if self._machine is None:
            self._placed = {}
            self._machine = make_backend(self.backend, seed=self.seed, **self.backend_options)
            self.backends_built += 1
        return self._machine

    def _drop_backend(self) -> None:
        if self._machine is not None:
            machine, self._machine = self._machine, None
            machine.close()

    def _placement(self) -> str:
        return "layers" if self.gpus > 1 else "sequence"

    def _check_open(self) -> None:
        if self.closed:
            raise InputError("the session is closed")

