"""The LLaMA training step (frontend/workloads/llama/train.py) against torch autograd in float64.

Per family (llama with GQA; mistral with a sliding window that the block size does not divide; qwen2 with
q/k/v biases and tied embeddings) and batch (1 and 2 sequences side by side): the step's loss equals
`XForCausalLM(input_ids=ids, labels=ids).loss` and its LoRA gradients equal the gradients torch's autograd
gives adapters added by hand (y = W x + alpha/r B A x), under a budget that forces offload (and, with
a slow host link and `remat`, recomputes), in random dispatch orders that agree bit for bit; the plan
verifies (compile_taskgraph verifies every memgraph).
Two GPUs give the one-GPU step bit for bit; one plan serves every loss scale (an input); fp16 with a loss
scale lands near the float64 gradients; the base weights get no gradient task; a bad batch or adapter is
refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest

from frontend.workloads import llama
from frontend.workloads.llama.config import from_hf
from frontend.workloads.llama.train import LoraSpec, build_training_step
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from turnip_ir.cost import CostModel
from turnip_ir.errors import InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}
FAMILIES = {
    "llama": ("Llama", TINY),
    "mistral": ("Mistral", {**TINY, "sliding_window": 5}),
    "qwen2": ("Qwen2", {**TINY, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
}
LORA = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
SEQ_LEN, BLOCK = 11, 4
SLOW_LINK = CostModel(h2d_bw=1e6, d2h_bw=1e6, launch=0.0)
"""A host link so slow that the planner recomputes activations where it can (tests/test_remat.py's)."""


def _inputs(config, batch, seed=0):
    rng = np.random.default_rng(seed)
    weights = dict(llama.RandomWeights(config, seed=1))
    adapters = {name: 0.2 * rng.standard_normal(shape) for name, shape in LORA.shapes(config).items()}  # B != 0: dA != 0
    return weights, adapters, rng.integers(0, config.vocab_size, (batch, SEQ_LEN))


def _torch_step(family, doc, weights, adapters, ids):
    """transformers' loss and the adapters' gradients by autograd, in float64."""
    hf_config = getattr(transformers, f"{family}Config")(**doc, attn_implementation="eager")
    model = getattr(transformers, f"{family}ForCausalLM")(hf_config).double()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in weights.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.requires_grad_(False)
    params = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LORA.targets:
            a, b = (torch.tensor(adapters[f"{name}.lora_{x}.weight"], requires_grad=True) for x in "AB")
            params |= {f"{name}.lora_A.weight": a, f"{name}.lora_B.weight": b}
            module.forward = lambda x, base=module.forward, a=a, b=b: base(x) + LORA.scaling * (x @ a.T) @ b.T
    loss = model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids)).loss
    loss.backward()
    return loss.item(), {name: p.grad.numpy() for name, p in params.items()}


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_loss_and_lora_gradients_equal_torch_autograd(family, batch):
    name, doc = FAMILIES[family]
    config = from_hf({**doc, "model_type": family, "dtype": "float64"}, family)
    step = build_training_step(config, batch, SEQ_LEN, LORA, block=BLOCK)
    weights, adapters, ids = _inputs(config, batch)
    inputs = step.feed(weights, adapters, ids)
    remat = {"remat": True, "cost": SLOW_LINK} if batch == 2 else {}
    memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.5), **remat)
    assert memgraph.count("offload") > 0  # the budget forces offload
    assert (len(memgraph.recomputes()) > 0) == (batch == 2)  # and a slow link, recomputes
    runs = [execute(memgraph, "cpu", order="random", seed=seed, inputs=inputs).outputs for seed in (0, 1)]
    for task in runs[0]:
        np.testing.assert_array_equal(runs[0][task], runs[1][task])
    want_loss, want = _torch_step(name, doc, weights, adapters, ids)
    assert step.loss(runs[0]) == pytest.approx(want_loss, rel=1e-6)
    grads = step.grads(runs[0])
    assert list(grads) == list(LORA.shapes(config))
    for adapter, expected in want.items():
        error = np.abs(grads[adapter] - expected).max() / np.abs(expected).max()
        assert error <= 1e-5, f"{adapter}: relative error {error:.2e}"


@pytest.mark.parametrize("recompute,layer_order", [(1, "blocks"), (2, "halves")])
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_recomputed_layers_give_the_same_step_as_kept_ones(family, recompute, layer_order):
    """The first `recompute` layers' forward computed again before their backward: the loss and the LoRA
    gradients of the plain step bit for bit, and torch autograd's, under offload in a random order."""
    name, doc = FAMILIES[family]
    config = from_hf({**doc, "model_type": family, "dtype": "float64"}, family)
    weights, adapters, ids = _inputs(config, 1)
    results = []
    for count in (0, recompute):
        step = build_training_step(config, 1, SEQ_LEN, LORA, block=BLOCK, recompute=count, layer_order=layer_order)
        assert step.recomputed == count
        memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.5))
        outputs = execute(memgraph, "cpu", order="random", seed=count, inputs=step.feed(weights, adapters, ids)).outputs
        results.append((step.loss(outputs), step.grads(outputs), len(step.graph.nodes)))
    (loss, grads, tasks), (loss_again, grads_again, tasks_again) = results
    assert tasks_again > tasks  # the forward written again
    assert loss_again == loss
    for adapter, g in grads.items():
        np.testing.assert_array_equal(grads_again[adapter], g)
    want_loss, want = _torch_step(name, doc, weights, adapters, ids)
    assert loss_again == pytest.approx(want_loss, rel=1e-6)
    for adapter, expected in want.items():
        assert np.abs(grads_again[adapter] - expected).max() <= 1e-5 * np.abs(expected).max()


def test_gradients_in_place_are_the_runs_own_arrays_and_equal_the_gathered_ones():
    """`grads(in_place=True)` divides a one-block gradient where the run left it (no copy); by default the
    outputs are left as they are and new arrays returned; both give the same values."""
    _, doc = FAMILIES["llama"]
    config = from_hf({**doc, "model_type": "llama", "dtype": "float64"}, "llama")
    step = build_training_step(config, 1, SEQ_LEN, LORA, block=BLOCK, loss_scale=4.0)
    weights, adapters, ids = _inputs(config, 1)
    memgraph = compile_taskgraph(step.graph, int(minimum_budget(step.graph) * 1.5))
    outputs = execute(memgraph, "cpu", inputs=step.feed(weights, adapters, ids)).outputs
    kept = {task: array.copy() for task, array in outputs.items()}
    copied = step.grads(outputs)
    assert all(np.array_equal(outputs[task], kept[task]) for task in outputs)  # left as they were
    owned = step.grads(outputs, in_place=True)
    assert any(len(x.blocks) == 1 for x in step.gradients.values())
    for adapter, g in owned.items():
        np.testing.assert_array_equal(g, copied[adapter])
        x = step.gradients[adapter]
        if len(x.blocks) == 1:
            assert g is outputs[next(iter(x.blocks.values())).id]


def test_half_precision_with_a_loss_scale_lands_near_float64():
    doc = {**TINY, "model_type": "llama"}
    wide = build_training_step(from_hf({**doc, "dtype": "float64"}, "f64"), 1, SEQ_LEN, LORA, block=BLOCK)
    half = build_training_step(from_hf({**doc, "dtype": "float16"}, "f16"), 1, SEQ_LEN, LORA, block=BLOCK, loss_scale=1024.0)
    weights, adapters, ids = _inputs(wide.config, 1)
    exact = execute(compile_taskgraph(wide.graph, 1 << 30), "cpu", inputs=wide.feed(weights, adapters, ids)).outputs
    weights16 = {k: np.asarray(v, np.float16) for k, v in weights.items()}
    masters = {name: value.astype(np.float32) for name, value in adapters.items()}  # converted by feed
    rough = execute(compile_taskgraph(half.graph, 1 << 30), "cpu", inputs=half.feed(weights16, masters, ids)).outputs
    assert half.loss(rough) == pytest.approx(wide.loss(exact), rel=1e-2)
    for adapter, want in wide.grads(exact).items():
        got = half.grads(rough)[adapter]
        assert got.dtype == np.float32
        assert np.abs(got - want).max() <= 0.03 * np.abs(want).max(), adapter


def test_one_plan_serves_every_loss_scale():
    """The scale is an input: a power of two fed to the same plan scales every float64 gradient exactly."""
    config = from_hf({**TINY, "dtype": "float64"}, "tiny")
    step = build_training_step(config, 1, SEQ_LEN, LORA, block=BLOCK, loss_scale=4.0)
    memgraph = compile_taskgraph(step.graph, 1 << 30)
    weights, adapters, ids = _inputs(config, 1)
    built = execute(memgraph, "cpu", inputs=step.feed(weights, adapters, ids)).outputs
    fed = execute(memgraph, "cpu", inputs=step.feed(weights, adapters, ids, loss_scale=512.0)).outputs
    assert step.loss(built) == step.loss(fed)
    for name, g in step.grads(built).items():
        np.testing.assert_array_equal(step.grads(fed, loss_scale=512.0)[name], g)
        assert np.abs(step.grads(fed)[name]).max() == 128 * np.abs(g).max()  # read as if 4.0 were fed


def test_two_gpus_give_the_one_gpu_step_bit_for_bit():
    """Sequence and layers placements move blocks between the GPUs; the sums and their order are the same."""
    config = from_hf({**TINY, "dtype": "float64"}, "tiny")
    weights, adapters, ids = _inputs(config, 2)
    results = []
    for gpus, placement in ((1, "sequence"), (2, "sequence"), (2, "layers")):
        step = build_training_step(config, 2, SEQ_LEN, LORA, block=BLOCK, gpus=gpus, placement=placement)
        memgraph = compile_taskgraph(step.graph, 1 << 20)
        assert (memgraph.count("move") > 0) == (gpus == 2)
        outputs = execute(memgraph, "cpu", order="random", inputs=step.feed(weights, adapters, ids)).outputs
        results.append((step.loss(outputs), step.grads(outputs)))
    for loss, grads in results[1:]:
        assert loss == results[0][0]
        for name, g in grads.items():
            np.testing.assert_array_equal(g, results[0][1][name])


def test_the_base_weights_get_no_gradient_and_the_outputs_are_the_loss_and_adapters():
    config = from_hf({**TINY, "dtype": "float32"}, "tiny")
    step = build_training_step(config, 1, SEQ_LEN, LORA, block=BLOCK)
    graph = step.graph
    base = {shape for name, shape in llama.weight_shapes(config).items() if name != "model.embed_tokens.weight"}
    backward = [node for node in graph.nodes.values() if node.id.startswith("d")]
    assert backward and not [node.id for node in backward if node.shape in base and len(node.shape) == 2]
    assert {node.shape for node in backward if node.op == "cast"} <= set(LORA.shapes(config).values())
    outputs = {graph.nodes[task].shape for task in graph.outputs}
    assert outputs == {(2,)} | set(LORA.shapes(config).values())
    blocks = [f"{name}[{b},0]" for name in ("hidden", "rope.cos", "rope.sin") for b in range(3)]
    assert step.activation_ids == {*blocks, "labels[0]", "labels[1]", "labels[2]", "loss_scale"}


@pytest.mark.parametrize("change, message", [
    ({"ids": np.zeros((2, SEQ_LEN), np.int64)}, r"ids must be integers of shape \[1, 11\]"),
    ({"labels": np.full((1, SEQ_LEN), 64)}, "label 64 is neither -100 nor in the vocabulary"),
    ({"drop": "model.layers.1.mlp.down_proj.lora_B.weight"}, "adapter 'model.layers.1.mlp.down_proj.lora_B.weight' is missing"),
    ({"reshape": "model.layers.0.self_attn.q_proj.lora_A.weight"}, r"has shape \[4, 33\], the model needs \[4, 32\]"),
])
def test_a_bad_batch_or_adapter_is_refused_in_one_line(change, message):
    config = from_hf({**TINY, "dtype": "float32"}, "tiny")
    step = build_training_step(config, 1, SEQ_LEN, LORA, block=BLOCK)
    weights, adapters, ids = _inputs(config, 1)
    adapters.pop(change.get("drop"), None)
    if "reshape" in change:
        adapters[change["reshape"]] = np.zeros((4, 33))
    with pytest.raises(InputError, match=message):
        step.feed(weights, adapters, change.get("ids", ids), change.get("labels"))


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": 0}, "rank must be a positive integer"),
    ({"alpha": -1.0}, "alpha must be a positive number"),
    ({"targets": ("q_proj", "lm_head")}, "unknown target 'lm_head'"),
])
def test_a_bad_lora_spec_is_refused_in_one_line(kwargs, message):
    with pytest.raises(InputError, match=message):
        LoraSpec(**kwargs)
