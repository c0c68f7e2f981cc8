"""Generation: the decode step equals a float64 numpy decode, the tokens equal transformers' greedy
`generate` on tiny random checkpoints (GQA, llama3 RoPE, tied embeddings, a ragged batch, a budget that
forces offload, random dispatch orders), sampling is reproducible, the session caches its plans and
survives a failed call, and `turnip generate` reads its inputs and refuses bad ones with one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from frontend.safetensors import save_file
from frontend.workloads import llama
from frontend.workloads.llama.float64_forward import float64_forward
from passes.pipeline import compile_taskgraph
from runtime import arena_budget, execute
from turnip import Session
from turnip_cli.main import main
from turnip.sampling import _ordered, argmax16, next_tokens
from turnip_ir.errors import InputError, KernelError

ROOT = Path(__file__).resolve().parent.parent
TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
        "rope_theta": 10000.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
OFFLOAD_BUDGET = 64 << 10
"""Below TINY's weights (~280 KiB) and above its largest op (the LM head, ~33 KiB)."""
GQA_BUDGET = 100 << 10
CUDA_RESERVE = (80 << 20) + 2 * (4 << 20) + (4 << 10)
"""What the cuda backend (cuBLAS attention, two lanes) holds back beside the arena for these tiny models:
the libraries' base, their memory per lane and the page tables of under 2 MiB pinned (devices.reserve_bytes)."""
"""The same for the tiny-gqa preset (~420 KiB of weights, a 64 KiB LM head)."""


def reference_logits(config, weights, ids) -> np.ndarray:
    """float64 logits of the last position, recomputing the whole sequence (no cache)."""
    hidden = float64_forward(config, weights, ids)[-1]
    return np.asarray(weights[llama.head_name(config)], dtype=np.float64) @ hidden


def reference_greedy(config, weights, prompt, steps) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(reference_logits(config, weights, np.array(ids)))))
    return ids[len(prompt):]


def _run(graph, inputs, budget=1 << 30):
    return execute(compile_taskgraph(graph, budget), backend="cpu", inputs=inputs).outputs


@pytest.mark.parametrize("gpus, kv_block", [(1, 1024), (1, 2), (2, 3)])
def test_decode_step_equals_float64_decode(gpus, kv_block):
    config = llama.load_config("tiny-gqa")
    weights = llama.RandomWeights(config, 5)
    prompts = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([7]), np.array([2, 7, 1, 8])]
    caches = []
    for prompt in prompts:  # prefill of all but the last token, its k and v as outputs
        head = prompt[:-1]
        if len(head) == 0:
            caches.append([(np.empty((0, 32), "float32"),) * 2] * config.num_hidden_layers)
            continue
        built = llama.build_llama(config, len(head), block=2, kv_outputs=True)
        caches.append(built.gather_kv(_run(built.graph, built.feed(weights, head))))
    step = llama.build_decode_step(config, [len(p) - 1 for p in prompts], gpus=gpus, kv_block=kv_block)
    hidden = llama.embed(weights, np.array([p[-1] for p in prompts]), config)
    outputs = _run(step.graph, step.feed(weights, hidden, caches))
    logits = step.logits(outputs)
    assert logits.shape == (3, config.vocab_size)
    for b, prompt in enumerate(prompts):
        np.testing.assert_allclose(logits[b], reference_logits(config, weights, prompt), rtol=1e-4, atol=1e-4)
    assert [k.shape for k, _ in step.new_kv(outputs)] == [(3, 32)] * config.num_hidden_layers


def test_decode_step_kernels_and_inputs():
    config = llama.load_config("tiny-gqa")
    step = llama.build_decode_step(config, [0, 5], kv_block=2)
    nodes = step.graph.nodes
    assert step.columns == [(0, 2), (2, 2), (4, 2)] and step.key == (2, 2, ((0, 2), (2, 2), (4, 2)))
    assert nodes["kv.0.k[2]"].shape == (2, 2, 32) and nodes["kv.lengths"].shape == (2,)  # [rows, B, kv_width]
    links = [node for node in nodes.values() if node.op == "decode_attention" and node.id.startswith("l0.")]
    assert [(n.id, n.attrs.get("start"), n.attrs.get("own", False)) for n in links] == [
        ("l0.attn.0", 0, False), ("l0.attn.1", 2, False), ("l0.attn.2", 4, False), ("l0.attn", None, True)]
    assert not any(node.op in ("rows", "concat", "attention") for node in nodes.values())  # the batch in one link
    assert {"logits[0,0]", "logits[0,1]", "l1.k_rope", "l1.v"} <= set(step.graph.outputs)
    wide = llama.build_decode_step(config, [40, 1030], kv_block=1024)
    assert wide.columns == [(0, 1024), (1024, 64)]  # the last column: 64 rows at least, then 128, then multiples of 128
    assert llama.build_decode_step(config, [40, 1088], kv_block=1024).key == wide.key
    assert llama.build_decode_step(config, [40, 1089], kv_block=1024).columns[-1] == (1024, 128)
    assert [llama.build_decode_step(config, [n], kv_block=1024).columns[-1][1] for n in (129, 256, 257, 513, 1000)] == [256, 256, 384, 640, 1024]
    with pytest.raises(InputError, match="cache length 0 must be an integer >= 0, got -1"):
        llama.build_decode_step(config, [-1])


def test_the_decode_heads_blocks_spread_over_gpus_and_need_not_fit_whole():
    """The LM head is cut in blocks of vocabulary rows, each its own input and task, block j on GPU j % gpus;
    a budget too small for the whole head beside the step's working set still compiles, and the blocks put
    side by side are the logits."""
    from frontend.workloads.llama.decode import head_blocks
    from passes.insert_offload import minimum_budget

    config = llama.load_config("tiny")
    blocks = head_blocks(config)
    assert len(blocks) == 2 and blocks[0][0] == 0 and blocks[-1][1] == config.vocab_size
    step = llama.build_decode_step(config, [3, 5], gpus=2, kv_block=4)
    heads = [step.graph.nodes[f"logits[0,{j}]"] for j in range(len(blocks))]
    assert [node.device for node in heads] == [0, 1]
    assert all(node.shape == (2, stop - start) for node, (start, stop) in zip(heads, blocks))
    whole = config.vocab_size * config.hidden_size * 4
    assert minimum_budget(llama.build_decode_step(config, [3, 5], kv_block=4).graph) < whole
    outputs = {f"logits[0,{j}]": np.full((2, stop - start), j, np.float32) for j, (start, stop) in enumerate(blocks)}
    assert step.logits(outputs).tolist() == [[0] * (blocks[0][1]) + [1] * (blocks[1][1] - blocks[1][0])] * 2


def test_greedy_session_equals_float64_reference_on_random_weights():
    config = llama.load_config("tiny-gqa")
    prompts = [np.array([5, 6, 7]), np.array([9])]
    with Session(config="tiny-gqa", memory=GQA_BUDGET, backend="cpu", seed=3) as session:
        result = session.generate(prompts, 4)
    weights = llama.RandomWeights(config, 3)
    assert result.tokens.dtype == np.int64 and result.tokens.shape == (2, 4)
    for b, prompt in enumerate(prompts):
        assert result.tokens[b].tolist() == reference_greedy(config, weights, prompt, 4)
    assert result.bytes_reloaded > 0  # the budget forces offload


# ----- transformers ---------------------------------------------------------------------------------------
def write_checkpoint(folder: Path, doc: dict, seed: int = 2) -> None:
    transformers = pytest.importorskip("transformers")
    folder.mkdir()
    transformers.LlamaConfig(**doc).save_pretrained(folder)
    config = llama.load_config(str(folder))
    weights = dict(llama.RandomWeights(config, seed))
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, folder / "model.safetensors")


def hf_greedy(folder: Path, prompt: np.ndarray, steps: int) -> list[int]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(folder)).float().eval()
    missing, unexpected = model.load_state_dict(safetensors_torch.load_file(folder / "model.safetensors"), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if missing:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    model.generation_config.eos_token_id = None  # exactly `steps` tokens
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt)[None], max_new_tokens=steps, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


HF_CASES = {
    "gqa": TINY,
    "gqa, llama3 rope": {**TINY, "rope_theta": 500000.0, "rope_scaling": LLAMA3},
    "tied embeddings": {**TINY, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("case", HF_CASES)
def test_tokens_equal_transformers_greedy_generate(tmp_path, case):
    write_checkpoint(tmp_path / "m", HF_CASES[case])
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 128, n) for n in (6, 1, 11)]  # ragged: each compared with HF on it alone
    expected = [hf_greedy(tmp_path / "m", p, 5) for p in prompts]
    with Session(weights=tmp_path / "m", memory=OFFLOAD_BUDGET, backend="cpu") as session:
        for order_seed in (0, 1, 2):
            session.order, session.seed = "random", order_seed
            result = session.generate(prompts, 5)
            assert result.tokens.tolist() == expected
            assert result.bytes_reloaded > 0


# ----- sampling and the session -------------------------------------------------------------------------
def test_sampling_is_reproducible_for_a_seed():
    prompts = [np.array([1, 2, 3]), np.array([4, 5])]
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        greedy = session.generate(prompts, 6).tokens
        assert (session.generate(prompts, 6, temperature=0.0, top_p=0.5, seed=9).tokens == greedy).all()
        first = session.generate(prompts, 6, temperature=1.5, top_p=0.95, seed=7).tokens
        again = session.generate(prompts, 6, temperature=1.5, top_p=0.95, seed=7).tokens
        other = session.generate(prompts, 6, temperature=1.5, top_p=0.95, seed=8).tokens
    assert (first == again).all()
    assert (first != other).any() and (first != greedy).any()


def test_next_tokens_rules():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    assert next_tokens(logits, 0.0, 1.0, rng).tolist() == [1, 0]  # first index on ties
    draws = {tuple(next_tokens(logits, 1.0, 1e-9, rng)) for _ in range(20)}  # top_p this small: the top token
    assert draws == {(1, 0)}
    counts = np.bincount([next_tokens(logits[:1], 1.0, 1.0, rng)[0] for _ in range(2000)], minlength=4)
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert np.abs(counts / 2000 - probs).max() < 0.05


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_greedy_over_16_bit_logits_is_float64s_argmax(dtype):
    """argmax16 orders the floats by their bits: every bit pattern but the NaNs keeps its order (ties
    only where the floats are equal: -0 and +0), and random rows with zeros, infinities and the extremes
    pick float64's argmax, lowest index on ties; a NaN anywhere falls back to numpy's rule."""
    kind = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    every = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16).view(kind)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        wide = every.astype(np.float64)
    keep = ~np.isnan(wide)
    order = np.argsort(wide[keep], kind="stable")
    keys = _ordered(every)[keep][order].astype(np.int32)
    assert (np.diff(keys) >= 0).all() and ((np.diff(keys) == 0) == (np.diff(wide[keep][order]) == 0)).all()
    rng = np.random.default_rng(3)
    top = float(ml_dtypes.finfo(kind).max)
    pool = np.concatenate([[0.0, -0.0, np.inf, -np.inf, 1e-7, -1e-7, top, -top], rng.standard_normal(40)]).astype(kind)
    for _ in range(200):
        logits = rng.choice(pool, size=(4, 29))
        assert next_tokens(logits, 0.0, 1.0, rng).tolist() == np.argmax(logits.astype(np.float64), axis=1).tolist()
    logits[2, 5] = np.nan
    assert argmax16(logits) is None
    assert next_tokens(logits, 0.0, 1.0, rng).tolist() == np.argmax(logits.astype(np.float64), axis=1).tolist()


def test_second_call_compiles_nothing_and_a_failed_call_leaves_the_session_usable():
    prompts = [np.array([1, 2, 3]), np.array([4])]
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        first = session.generate(prompts, 3)
        # a prefill and one decode plan: the three steps' caches (2 and 0 tokens, then 3 and 1, 4 and 2) fit
        # one last column of 16 rows, so steps two and three run the first one's plan
        assert first.compiles == 2 and first.cache_hits == 2
        # and they copy only what changed: the new tokens, their RoPE rows, the lengths and the column written
        assert first.step_bytes_placed[1] == first.step_bytes_placed[2] < first.step_bytes_placed[0] / 5
        with pytest.raises(InputError, match=r"^prompt 1: token id 256 is out of the vocabulary range \[0, 256\)$"):
            session.generate([np.array([1]), np.array([2, 256])], 3)
        with pytest.raises(InputError, match="^prompt 0 is empty$"):
            session.generate([np.array([], dtype=np.int64)], 3)
        second = session.generate(prompts, 3)
        assert second.compiles == 0 and second.cache_hits == 4
        assert (second.tokens == first.tokens).all()
        hidden = session.prefill(np.array([1, 2, 3]))
        expected = float64_forward(session.config, llama.RandomWeights(session.config, 0), np.array([1, 2, 3]))
        np.testing.assert_allclose(hidden, expected, rtol=1e-4, atol=1e-4)
    session.close()  # idempotent
    with pytest.raises(InputError, match="^the session is closed$"):
        session.generate(prompts, 3)


def _fail_swiglu(monkeypatch, backend: str) -> None:
    """Make every swiglu vertex raise when it runs (on the cpu backend's numpy kernels or the cuda builders)."""
    def boom(*args):
        raise RuntimeError("injected")

    if backend == "cpu":
        from runtime.backends import cpu

        monkeypatch.setitem(cpu.NUMPY_KERNELS, "swiglu", boom)
    else:
        from runtime.backends.cuda import builders

        monkeypatch.setitem(builders.BUILDERS, "swiglu", lambda *args: boom)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_session_keeps_one_backend_and_a_failed_run_leaves_it_usable(monkeypatch, tmp_path, backend):
    """The second generate builds no backend and compiles nothing; a run that fails on the device closes
    the backend, and the next call makes a new one and gives the same tokens (cuda: numba-cuda's simulator)."""
    prompts = [np.array([1, 2, 3]), np.array([4]), np.arange(5, 11)]  # prefill blocks of 1 and 2 tokens: two workspaces on cuda
    memory = (1 << 20) + (CUDA_RESERVE + (16 << 20) if backend == "cuda" else 0)  # the cuda workspace beside the arena
    new, config = 2, "tiny"
    if backend == "cuda":  # the simulator runs every kernel thread in Python: one layer of two heads, one decode step
        new, config = 1, str(tmp_path / "config.json")
        (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                                          "num_attention_heads": 2, "intermediate_size": 64}))
    with Session(config=config, memory=memory, backend=backend) as session:
        first = session.generate(prompts, new)
        assert session.backends_built == 1 and first.compiles == 2  # one prefill of the prompts packed, then one plan for the decode steps
        machine = session._machine
        second = session.generate(prompts, new)
        assert second.compiles == 0 and session.backends_built == 1 and session._machine is machine
        assert (second.tokens == first.tokens).all()
        with monkeypatch.context() as patch:
            _fail_swiglu(patch, backend)
            if backend == "cuda":  # the backend keeps the works it built: have it build them again, with the failing one
                machine.loaded.clear()
                machine.views = None
            with pytest.raises(KernelError, match="failed: RuntimeError: injected"):
                session.generate(prompts, new)
        assert session._machine is None
        third = session.generate(prompts, new)
        assert third.compiles == 0 and session.backends_built == 2
        assert (third.tokens == first.tokens).all()
    assert session._machine is None


def test_a_cuda_session_reads_its_weights_and_cache_in_place(tmp_path):
    """On the cuda backend (numba-cuda's simulator) a session keeps its weights and KV cache in page-locked
    memory, and the plans read the inputs they keep in host storage from there: nothing is staged, where
    the cpu backend copies them into its storage; the tokens are the same."""
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 64}))
    prompts = [np.array([1, 2, 3]), np.arange(4, 9)]
    results = {}
    for backend, memory in (("cpu", 40_000), ("cuda", 40_000 + CUDA_RESERVE)):  # cuda: its workspace beside the same arena
        with Session(config=str(tmp_path / "config.json"), memory=memory, backend=backend) as session:
            results[backend] = session.generate(prompts, 2)
            if backend == "cuda":
                assert {"kv.0.k[0]", "kv.0.v[0]"} <= session._machine.external_inputs()
    assert results["cpu"].bytes_staged > 0 and results["cuda"].bytes_staged == 0
    assert (results["cuda"].tokens == results["cpu"].tokens).all()


def test_a_cuda_session_locks_its_checkpoint_files_on_a_thread_while_the_call_goes_on(tmp_path):
    """A checkpoint in the compute dtype is read in place from its page-locked file maps; a thread begun at the
    session's start locks every shard's map (the call finds them locked), and the tokens are the cpu's."""
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    config = {**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = llama.RandomWeights(llama.load_config(str(tmp_path / "config.json")), 0)
    names = list(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file, part in shards.items():
        save_file({name: np.asarray(weights[name]) for name in part}, tmp_path / file)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: f for f, part in shards.items() for n in part}}))
    prompts = [np.array([1, 2, 3]), np.arange(4, 9)]
    with Session(weights=str(tmp_path), memory=60_000, backend="cpu") as session:
        want = session.generate(prompts, 2).tokens
    with Session(weights=str(tmp_path), memory=60_000 + CUDA_RESERVE, backend="cuda") as session:
        [locking] = session.host._soon
        assert locking.thread.name == "turnip file locking"
        locking.thread.join()
        assert len(session.host.mappings) == len(shards)
        assert (session.generate(prompts, 2).tokens == want).all()
        assert len(session.host.mappings) == len(shards)


def test_a_cuda_session_plans_again_when_a_plan_pins_more_than_the_estimate(tmp_path, monkeypatch):
    """A plan that pins more host memory than `arena_budget`'s estimate needs more GPU page tables than its
    arena left room for: the session shrinks its arena and compiles it again (here the estimate is made 0,
    so every first plan pins more), and every plan it keeps fits the budget with the tables of what it pins."""
    import runtime.api as api
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 64}))
    prompts, memory = [np.array([1, 2, 3]), np.arange(4, 9)], 40_000 + CUDA_RESERVE
    with Session(config=str(tmp_path / "config.json"), memory=memory, backend="cpu") as session:
        expected = session.generate(prompts, 2).tokens
    monkeypatch.setattr(api, "_pinned_estimate", lambda graph: 0)
    monkeypatch.setattr(Session, "_call_pinned", lambda self, prompts, steps: 0)  # the call's estimate too
    with Session(config=str(tmp_path / "config.json"), memory=memory, backend="cuda") as session:
        packed = llama.build_llama(session.config, 6, kv_outputs=True, sequences=(2, 4), hidden=False)
        estimate = arena_budget(packed.graph, memory, "cuda")
        result = session.generate(prompts, 2)
        assert session.arena < estimate and result.compiles > 2  # planned again at least once: a prefill and a decode plan
        assert session.cache and all(plan.budget <= arena_budget(plan, memory, "cuda") for plan in session.cache.values())
    assert (result.tokens == expected).all()


def test_a_cuda_session_writes_a_steps_new_rows_straight_into_the_cache(tmp_path, monkeypatch):
    """Prompts of one length: every step's new k and v rows are copied from the GPU into the cache's
    next row (`execute(outputs_into=)`), never through the staging and `KvCache.append`; the tokens
    are the cpu backend's, which writes them after the run."""
    from frontend.workloads.llama.kv_cache import KvCache
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 64}))
    prompts = [np.array([1, 2, 3]), np.array([7, 8, 9])]
    results, targets = {}, []
    for backend, memory in (("cpu", 40_000), ("cuda", 40_000 + CUDA_RESERVE)):
        with Session(config=str(tmp_path / "config.json"), memory=memory, backend=backend) as session:
            if backend == "cuda":
                monkeypatch.setattr(KvCache, "append", lambda self, rows: pytest.fail("rows appended through the host"))
                read = type(session._backend()).read_outputs

                def spy(machine, copy=True):
                    targets.append(len(machine.views.targets))
                    return read(machine, copy)

                monkeypatch.setattr(type(session._backend()), "read_outputs", spy)
            results[backend] = session.generate(prompts, 3)
    assert (results["cuda"].tokens == results["cpu"].tokens).all()
    assert targets[-3:] == [2, 2, 2]  # the decode steps: k and v of the one layer, each run


def test_outputs_into_the_callers_arrays_or_a_one_line_error():
    """`execute(outputs_into=)`: the result holds the caller's arrays, filled; an array of another shape
    or dtype, or a name that is no output, is refused before anything runs."""
    graph = llama.build_llama(llama.load_config("tiny"), 4).graph
    memgraph = compile_taskgraph(graph, 1 << 20)
    plain = execute(memgraph, backend="cpu", seed=3)
    task = next(iter(plain.outputs))
    target = np.empty_like(plain.outputs[task])
    into = execute(memgraph, backend="cpu", seed=3, outputs_into={task: target})
    assert into.outputs[task] is target
    np.testing.assert_array_equal(target, plain.outputs[task])
    with pytest.raises(InputError, match=rf"^outputs_into\['{re.escape(task)}'\] must be a float32 array of shape "):
        execute(memgraph, backend="cpu", outputs_into={task: np.empty((1,), np.float32)})
    with pytest.raises(InputError, match=r"^outputs_into names 'nope', which is not an output of the graph$"):
        execute(memgraph, backend="cpu", outputs_into={"nope": target})


def test_teacher_forcing_feeds_the_given_tokens_and_keeps_each_steps_logits():
    config = llama.load_config("tiny")
    weights = llama.RandomWeights(config, 0)
    prompts = [np.array([5, 6, 7]), np.array([9])]
    forced = np.array([[1, 2, 3], [4, 5, 6]])
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        result = session.generate(prompts, 3, forced=forced)
        assert (result.tokens == forced).all() and len(result.logits) == 3
        for step in range(3):
            for b, prompt in enumerate(prompts):
                ids = np.concatenate([prompt, forced[b, :step]])
                np.testing.assert_allclose(result.logits[step][b], reference_logits(config, weights, ids), rtol=1e-4, atol=1e-4)
        with pytest.raises(InputError, match=r"^forced tokens must be integers of shape \[2, 3\], got int64 of shape \[2, 2\]$"):
            session.generate(prompts, 3, forced=forced[:, :2])
        width = config.num_key_value_heads * config.head_dim
        kv = session._prefill(prompts[:1], 0, result)  # the session's own prefill of the first prompt, read back per layer
        first = [tuple(kv.rows(layer, which, 0, 0, 2).copy() for which in "kv") for layer in range(config.num_hidden_layers)]
        caches = [first, [(np.empty((0, width), "float32"),) * 2] * config.num_hidden_layers]
        given = session.generate(prompts, 3, forced=forced, caches=caches)
        np.testing.assert_allclose(np.concatenate(given.logits), np.concatenate(result.logits), rtol=1e-6, atol=1e-6)
        assert given.prefill_seconds == 0
        with pytest.raises(InputError, match=rf"^prompt 1: its cache must hold 2 layers of \(k, v\), each \[0, {width}\]$"):
            session.generate(prompts, 3, caches=[caches[0], caches[0]])


def test_stop_at_eos_pads_with_the_eos_id():
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        free = session.generate([np.array([1, 2])], 6).tokens[0]
    eos = int(free[1])
    config = llama.load_config("tiny")
    import dataclasses

    with Session(config=dataclasses.replace(config, eos_token_id=(eos,)), memory=1 << 20, backend="cpu") as session:
        assert (session.generate([np.array([1, 2])], 6).tokens[0] == free).all()  # not asked: no stop
        result = session.generate([np.array([1, 2])], 6, stop_at_eos=True)
    stopped = result.tokens[0]
    first = free.tolist().index(eos)
    assert stopped.tolist() == free[: first + 1].tolist() + [eos] * (5 - first)
    assert result.steps == first + 1 < 6  # once every sequence has ended, no more steps run


# ----- the CLI ----------------------------------------------------------------------------------------------
@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def turnip(capsys, *args) -> Done:
    """`turnip generate ...` in this process (the subprocess test below covers the entry point)."""
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return Done(code, out, err)


def test_cli_entry_point_in_a_subprocess(tmp_path):
    out = tmp_path / "o.npz"
    args = [*BASE, "--prompt-tokens", "3", "--max-new-tokens", "2", "--outputs", str(out)]
    done = subprocess.run([sys.executable, "-m", "turnip_cli.main", "generate", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert np.load(out)["generated"].shape == (1, 2)


BASE = ("--config", "tiny", "--memory", "1MiB", "--backend", "cpu")


def test_cli_reads_npy_and_ragged_npz_and_writes_generated(tmp_path, capsys):
    np.save(tmp_path / "one.npy", np.array([1, 2, 3]))
    np.save(tmp_path / "batch.npy", np.array([[1, 2, 3], [4, 5, 6]]))
    np.savez(tmp_path / "ragged.npz", b=np.array([4, 5, 6, 7]), a=np.array([1, 2, 3]))
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        want = session.generate([np.array([4, 5, 6, 7]), np.array([1, 2, 3])], 3).tokens
    for name, rows in (("one.npy", 1), ("batch.npy", 2), ("ragged.npz", 2)):
        out = tmp_path / f"{name}.out.npz"
        done = turnip(capsys, *BASE, "--input-ids", tmp_path / name, "--max-new-tokens", 3, "--outputs", out)
        assert done.returncode == 0, done.stderr
        assert f"wrote {out}" in done.stdout and "tokens/s" in done.stdout and "peak arena" in done.stdout
        generated = np.load(out)["generated"]
        assert generated.dtype == np.int64 and generated.shape == (rows, 3)
    assert (np.load(tmp_path / "ragged.npz.out.npz")["generated"] == want).all()  # the order the file lists


def test_cli_random_prompts_and_sim_timing(tmp_path, capsys):
    done = turnip(capsys, *BASE, "--prompt-tokens", 4, "--batch", 3, "--max-new-tokens", 2, "--outputs", tmp_path / "o.npz",
                  "--trace", tmp_path / "t.json")
    assert done.returncode == 0, done.stderr
    assert np.load(tmp_path / "o.npz")["generated"].shape == (3, 2)
    assert json.loads((tmp_path / "t.json").read_text())
    sim = turnip(capsys, "--config", "tiny", "--memory", "1MiB", "--backend", "sim", "--prompt-tokens", 4, "--max-new-tokens", 2)
    assert sim.returncode == 0, sim.stderr
    assert "timing only" in sim.stdout


def test_the_summary_states_decodes_link_floor_where_a_step_copies(capsys):
    """On a backend with a host link, the summary states the floor a step's copies set (bytes over the rate
    they ran at) and the steady step against it; the cpu backend has no link and says nothing of it."""
    args = ("--config", "7b", "--memory", "2GiB", "--prompt-tokens", 1024, "--max-new-tokens", 3)
    with Session(config="7b", memory="2GiB", backend="sim") as session:  # the sim computes nothing: no weights drawn
        result = session.generate(np.zeros((1, 1024), np.int64), 3)
    moved, rate = result.step_link
    assert moved >= result.last_step.bytes_reloaded > 0 and rate == pytest.approx(result.last_step.h2d_bandwidth)
    sim = turnip(capsys, *args, "--backend", "sim")
    assert sim.returncode == 0, sim.stderr
    line = next(line for line in sim.stdout.splitlines() if line.startswith("decode's link floor"))
    floor_ms, ratio = re.search(r"([0-9.]+) ms at the [0-9.]+ GB/s its copies ran at; the steady step is ([0-9.]+)x that", line).groups()
    steady_ms = float(re.search(r"steady ([0-9.]+) ms a step", sim.stdout).group(1))
    assert float(floor_ms) == pytest.approx(moved / rate * 1e3, rel=1e-3)
    assert float(ratio) == pytest.approx(steady_ms / float(floor_ms), abs=0.01) and float(ratio) >= 0.99
    cpu = turnip(capsys, *BASE, "--prompt-tokens", 4, "--max-new-tokens", 3)  # BASE: tiny on the cpu backend
    assert cpu.returncode == 0, cpu.stderr
    assert "link floor" not in cpu.stdout


BAD = {
    "zero new tokens": (("--prompt-tokens", 4, "--max-new-tokens", 0), 1, "--max-new-tokens must be positive, got 0"),
    "negative new tokens": (("--prompt-tokens", 4, "--max-new-tokens", -2), 1, "--max-new-tokens must be positive, got -2"),
    "id outside the vocabulary": (("--input-ids", "{ragged_bad}", "--max-new-tokens", 2), 1,
                                  "prompt 1: token id 300 is out of the vocabulary range [0, 256)"),
    "empty prompt": (("--input-ids", "{empty}", "--max-new-tokens", 2), 1, "prompt 0 is empty"),
    "non-1-D array in an npz": (("--input-ids", "{flat}", "--max-new-tokens", 2), 1,
                                "array 'x' in '{flat}' must be a 1-D prompt of token ids, got shape [2, 2]"),
    "missing file": (("--input-ids", "{missing}", "--max-new-tokens", 2), 1, "token ids file '{missing}' does not exist"),
    "cannot fit one step": (("--prompt-tokens", 4, "--max-new-tokens", 2, "--memory", "4KiB"), 2, "needs"),
    "outputs on sim": (("--prompt-tokens", 4, "--max-new-tokens", 2, "--backend", "sim", "--outputs", "{out}"), 1,
                       "the sim backend computes no values, so --outputs needs a backend that computes"),
}


@pytest.mark.parametrize("case", BAD)
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    paths = {"ragged_bad": tmp_path / "bad.npz", "empty": tmp_path / "empty.npy", "flat": tmp_path / "flat.npz",
             "missing": tmp_path / "none.npy", "out": tmp_path / "never.npz"}
    np.savez(paths["ragged_bad"], a=np.array([1, 2]), b=np.array([3, 300]))
    np.save(paths["empty"], np.array([], dtype=np.int64))
    np.savez(paths["flat"], x=np.array([[1, 2], [3, 4]]))
    args, code, message = BAD[case]
    args = [str(a).format(**paths) for a in args]
    extra = [] if "--memory" in args else ["--memory", "1MiB"]
    backend = [] if "--backend" in args else ["--backend", "cpu"]
    out = [] if "--outputs" in args else ["--outputs", str(tmp_path / "o.npz")]
    done = turnip(capsys, "--config", "tiny", *extra, *backend, *out, *args)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnip generate: error: ")
    assert message.format(**paths) in lines[0]
    assert not (tmp_path / "o.npz").exists() and not paths["out"].exists()


def test_rows_and_concat_on_cuda_equal_numpy():
    """The decode step's two copy kernels on the cuda backend (numba-cuda's simulator here), an empty
    concat operand included."""
    from runtime.backends.cuda import CudaBackend
    from turnip_ir.taskgraph import TaskGraph

    g = TaskGraph(devices=1)
    x = g.input((4, 8), "float32", device=0, id="x")
    empty = g.input((0, 8), "float32", device=0, id="empty")
    row = g.kernel("rows", x, start=1, stop=3, device=0, id="r")
    g.output(row, g.kernel("concat", row, empty, x, device=0, id="c"))
    x_value = np.arange(32, dtype="float32").reshape(4, 8)
    inputs = {"x": x_value, "empty": np.empty((0, 8), "float32")}
    outputs = execute(compile_taskgraph(g, 1 << 20), backend=CudaBackend(), inputs=inputs).outputs
    np.testing.assert_array_equal(outputs["r"], x_value[1:3])
    np.testing.assert_array_equal(outputs["c"], np.concatenate([x_value[1:3], x_value]))


def test_a_decode_step_on_cuda_equals_cpu():
    """A batch of three ragged sequences (one with an empty cache), cache blocks of 2, under a budget that
    forces offload: the cuda backend (simulated) gives the cpu backend's logits and new rows."""
    from runtime.backends.cuda import CudaBackend

    config = llama.load_config("tiny-gqa")
    weights = llama.RandomWeights(config, 5)
    rng = np.random.default_rng(0)
    lengths = [3, 0, 2]
    caches = [[(rng.standard_normal((n, 32)).astype("float32"),) * 2 for _ in range(config.num_hidden_layers)] for n in lengths]
    step = llama.build_decode_step(config, lengths, kv_block=2)
    hidden = llama.embed(weights, np.array([3, 7, 1]), config)
    memgraph = compile_taskgraph(step.graph, GQA_BUDGET)
    assert any(node.op == "reload" for node in memgraph.nodes)
    inputs = step.feed(weights, hidden, caches)
    cpu = execute(memgraph, backend="cpu", inputs=inputs).outputs
    cuda = execute(memgraph, backend=CudaBackend(), inputs=inputs).outputs
    for name, want in cpu.items():
        np.testing.assert_allclose(cuda[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_turnip_llama_reads_ids_of_shape_1_by_t(tmp_path, capsys):
    ids = np.array([5, 1, 7, 3])
    np.save(tmp_path / "flat.npy", ids)
    np.save(tmp_path / "row.npy", ids[None])
    for name in ("flat", "row"):
        args = ["llama", "--config", "tiny", "--input-ids", tmp_path / f"{name}.npy", "--memory", "1MiB", "--backend", "cpu",
                "--outputs", tmp_path / f"{name}.npz"]
        assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    assert (np.load(tmp_path / "flat.npz")["hidden_states"] == np.load(tmp_path / "row.npz")["hidden_states"]).all()


def test_a_session_decodes_in_place_in_the_callers_token_major_buffers():
    """`generate(caches=KvCache.wrap(...))`: the steps read and write the caller's [capacity, B, kv_width]
    buffers (no copy), and the tokens equal those of the same caches given per prompt."""
    from frontend.workloads.llama.kv_cache import KvCache

    config = llama.load_config("tiny-gqa")
    rng = np.random.default_rng(2)
    prompts = [np.array([5, 6, 7, 8]), np.array([9, 3])]
    lengths = [len(p) - 1 for p in prompts]
    width = config.num_key_value_heads * config.head_dim
    per_prompt = [[tuple(rng.standard_normal((n, width)).astype("float32") for _ in "kv") for _ in range(config.num_hidden_layers)] for n in lengths]
    buffers = [tuple(np.zeros((8, 2, width), "float32") for _ in "kv") for _ in range(config.num_hidden_layers)]
    for b, seq in enumerate(per_prompt):
        for layer, pair in enumerate(seq):
            for buffer, rows in zip(buffers[layer], pair):
                buffer[: len(rows), b] = rows
    with Session(config="tiny-gqa", memory=GQA_BUDGET, backend="cpu", seed=3, kv_block=4) as session:
        wrapped = session.generate(prompts, 3, caches=KvCache.wrap(buffers, lengths, 4))
        listed = session.generate(prompts, 3, caches=per_prompt)
        assert (wrapped.tokens == listed.tokens).all()
        assert np.abs(buffers[0][0][lengths[1] : lengths[1] + 3, 1]).sum() > 0  # the new rows were written in place
        with pytest.raises(InputError, match="room for 8 tokens, the call needs 9"):
            session.generate(prompts, 6, caches=KvCache.wrap(buffers, lengths, 4))


def test_the_cache_names_each_written_row_so_a_ragged_step_copies_only_those():
    """A ragged batch writes rows far apart in a column: `written` gives each sequence's row its own range
    (flat rows r * B + b of the column seen as [rows * B, kv_width]), merged only where they touch."""
    from frontend.workloads.llama.kv_cache import KvCache

    cache = KvCache(1, 3, 2, 8, 16, "float32")
    cache.lengths[:] = [1, 6, 2]
    cache.append([(np.ones((3, 2)), np.ones((3, 2)))])
    assert cache.written(0, 8) == [(3, 4), (8, 9), (19, 20)]  # row 1 of sequence 0, row 2 of 2, row 6 of 1
    assert cache.written(0, 4) == [(3, 4), (8, 9)]  # a step that reads 4 rows of the column
    cache.settle()
    assert cache.written(0, 8) == []
    cache.lengths[:] = [4, 4, 4]
    cache.append([(np.ones((3, 2)), np.ones((3, 2)))])
    assert cache.written(0, 8) == [(12, 15)]  # one row of every sequence: one range


def test_a_new_decode_plan_starts_the_kept_inputs_where_the_backend_holds_them():
    """Crossing a column size (64 -> 128 rows) compiles a new decode plan; with inputs=recur and the
    backend's residency (`compile_taskgraph(kept=...)`) it starts the weights where the last plan left
    them, so its first step copies a fraction of what the first plan's first step did, and the tokens
    still equal the float64 reference."""
    config = llama.load_config("tiny-gqa")
    prompt = np.arange(62) % config.vocab_size
    with Session(config="tiny-gqa", memory=1 << 20, backend="cpu", seed=3) as session:
        result = session.generate([prompt], 6)
    assert result.compiles == 3  # the prefill, then the plans for 64 and 128 rows (61 + 4 > 64)
    placed = result.step_bytes_placed
    width = config.num_key_value_heads * config.head_dim
    columns = 2 * config.num_hidden_layers * 128 * width * 4  # the new plan's last column (128 rows, float32)
    steps_own = 4 * (config.hidden_size + 2 * config.head_dim + 1)  # the token's embedding, RoPE rows, length
    assert placed[4] <= columns + steps_own < placed[0], placed  # its first step copies no weight
    assert result.tokens[0].tolist() == reference_greedy(config, llama.RandomWeights(config, 3), prompt, 6)


@pytest.mark.parametrize("order", ["random", "nondet"])
def test_one_packed_prefill_gives_the_tokens_of_prompt_by_prompt_calls(monkeypatch, order):
    """A call's prompts (ragged, one of a single token, one longer than a token block) are prefilled in one
    packed plan, or in chunks when they exceed PREFILL_TOKENS, under a budget that offloads, in any order:
    the tokens equal those of calling each prompt alone (whose prefill is its own)."""
    import turnip.session as session_module

    prompts = [np.arange(1, 12), np.array([7]), np.arange(20, 27), np.arange(30, 60)]
    alone = []
    with Session(config="tiny", memory=150_000, backend="cpu", order=order, seed=3) as session:
        for prompt in prompts:
            alone.append(session.generate([prompt], 3).tokens[0])
        together = session.generate(prompts, 3)
        assert together.compiles == 2 and together.bytes_reloaded > 0  # one packed prefill, one decode plan; offloading
        monkeypatch.setattr(session_module, "PREFILL_TOKENS", 16)
        chunked = session.generate(prompts, 3)
        assert chunked.compiles == 1  # chunks of 10 + 6 and of 29 tokens: the second ran alone above, the first is new
    assert (together.tokens == np.array(alone)).all() and (chunked.tokens == together.tokens).all()


def test_a_cuda_session_writes_the_prefills_kv_rows_straight_into_the_cache(tmp_path):
    """On the cuda backend (numba-cuda's simulator) the packed prefill's k and v rows land in the cache from
    the GPU, whatever the budget: nothing is copied on the host after a run; the tokens are the cpu's."""
    from runtime.backends.cuda import simulated

    if not simulated():
        pytest.skip("runs numba-cuda's simulator")
    (tmp_path / "config.json").write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 2,
                                                      "num_attention_heads": 2, "intermediate_size": 64}))
    prompts = [np.array([1, 2, 3]), np.arange(4, 9)]
    results = {}
    for backend, memory in (("cpu", 40_000), ("cuda", 40_000 + CUDA_RESERVE)):
        with Session(config=str(tmp_path / "config.json"), memory=memory, backend=backend) as session:
            results[backend] = session.generate(prompts, 1)
    assert results["cuda"].bytes_copied_after == 0 and results["cuda"].bytes_written_straight > 0
    assert results["cpu"].bytes_copied_after > 0
    assert (results["cuda"].tokens == results["cpu"].tokens).all()


def test_a_session_takes_the_units_the_cli_takes_and_a_list_of_ids_as_one_prompt():
    with Session(config="tiny", memory="100KiB", backend="cpu") as session:
        assert session.memory == 102400
        one = session.generate([1, 2, 3], 2)
        assert one.tokens.shape == (1, 2)
        assert (session.generate(np.array([1, 2, 3]), 2).tokens == one.tokens).all()
    with pytest.raises(InputError, match="^memory size '4 parsecs' must be bytes or a number with KiB"):
        Session(config="tiny", memory="4 parsecs", backend="cpu")


def test_a_later_call_reuses_the_cache_bytes_of_an_earlier_one_and_its_tokens_are_its_own():
    """A call's KV cache lives in the session's lasting host memory: a later call that fits takes the same
    bytes (page-locking them again would cost seconds on cuda), laid out for its own shape, and its tokens
    are those of a fresh session (the earlier call's rows, now in other places, are never read)."""
    long, short = [np.arange(1, 40), np.arange(50, 70), np.arange(90, 95)], [np.arange(5, 12), np.array([3])]
    with Session(config="tiny", memory=1 << 20, backend="cpu") as fresh:
        expected = fresh.generate(short, 4).tokens
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        session.generate(long, 4)
        first = {key: buffer.ctypes.data for key, buffer in session.host._lasting.items()}
        again = session.generate(short, 4)
        assert {key: buffer.ctypes.data for key, buffer in session.host._lasting.items()} == first
    assert (again.tokens == expected).all()
