"""What the sim and the budget know of training's kernels on the cuda backend.

The cost model prices an `attention_grad` link of half operands at its own rates, on the FLOPs of the whole
fused backward of its block whichever gradient it keeps (what the torch paths run), not at the forward's;
the budget's reserve holds back the cublas path's scratch or the torch paths' library memory for it.
"""

from __future__ import annotations

import pytest

from runtime.backends.cuda import attention_grad, builders
from runtime.backends.cuda.devices import library_allowance, scratch_per_lane
from turnip_ir.cost import CostModel
from turnip_ir.memgraph import MemNode


def _link(wrt: str, causal: bool, dtype: str = "float16"):
    """A 7b-shaped link (4096 x 4096, 32 heads of 128) and its operands as memgraph nodes."""
    shapes = {"q": (4096, 4096), "k": (4096, 4096), "v": (4096, 4096), "packed": (4096, 4096 + 32), "do": (4096, 4096)}
    operands = [MemNode(i, "input", name, 0, (0, 0), None, (), shape=shape, dtype="float32" if name == "packed" else dtype)
                for i, (name, shape) in enumerate(shapes.items())]
    attrs = {"heads": 32, "kv_heads": 32, "wrt": wrt, "causal": causal}
    shape = (4096, 4096) if wrt == "q" else (8192, 4096)
    node = MemNode(5, "kernel", "g", 0, (0, 0), None, tuple(range(5)), kernel="attention_grad", shape=shape, dtype=dtype, attrs=attrs)
    return node, operands


@pytest.mark.parametrize("wrt", ["q", "kv"])
def test_attention_grad_links_cost_one_fused_backward_at_their_own_rates(wrt):
    model = CostModel(launch=0.0)
    fused = 10 * 4096 * 4096 * 4096
    full, causal = (model.kernel_time(*_link(wrt, c)) for c in (False, True))
    assert full == pytest.approx(fused / model.attention_grad_flops)
    assert causal == pytest.approx(fused / 2 / model.causal_attention_grad_flops)
    slower = CostModel(launch=0.0, attention_grad_flops=model.attention_grad_flops / 2)
    assert slower.kernel_time(*_link(wrt, False)) == pytest.approx(2 * full)
    assert CostModel(launch=0.0, attention_flops=1e12).kernel_time(*_link(wrt, False)) == pytest.approx(full)  # not the forward's
    node, operands = _link(wrt, False, "float32")  # the cublas path's float32 GEMMs: the kernel table's FLOPs
    assert model.kernel_time(node, operands) == pytest.approx((6 if wrt == "q" else 8) * 4096**3 / model.fp32_flops)


def test_the_reserve_holds_back_attention_grads_scratch_or_library_memory():
    """cublas: a 7b link's chunk (one kv head's scores: 192 MiB wrt kv, and its partial gradients) as lane
    scratch and no library memory; a torch path: no scratch, torch's blocks in the library allowance."""
    node, operands = _link("kv", False)
    nodes = [*operands, node]
    scratch = scratch_per_lane(nodes, "cublas")
    assert scratch == attention_grad.scratch_bytes(node, operands, "cublas") > 4096 * 4096 * 12 > 0
    assert scratch <= attention_grad.GRAD_SCRATCH
    assert builders.library_bytes(node, operands, "cublas") == 0
    assert scratch_per_lane(nodes, "torch-cudnn") == 0
    held = builders.library_bytes(node, operands, "torch-cudnn")
    assert held > 3 * 4096 * 4096 * 2  # dQ, dK and dV at least
    assert library_allowance(nodes, 2, "torch-cudnn") - library_allowance(nodes, 2, "cublas") >= held


def test_scratch_per_lane_asks_once_per_distinct_vertex_and_finds_the_same_maximum():
    """Memoised by signature (kernel, shape, dtype, attributes and the operands'): the same answer as asking
    every vertex, in fewer asks, for a prefill and a packed prefill, on every provider."""
    from frontend.workloads import llama
    from runtime.backends.cuda import builders
    from runtime.backends.cuda.devices import _as_op, scratch_per_lane

    config = llama.load_config("tiny")
    graphs = [llama.build_llama(config, 64).graph, llama.build_llama(config, 48, kv_outputs=True, sequences=(16, 32), hidden=False).graph]
    for graph in graphs:
        nodes = list(graph.nodes.values())
        ops = {op.id: op for op in map(_as_op, nodes)}
        for provider in ("cublas", "torch-cudnn", "triton"):
            asked = []

            def rule(node, sources, provider, asked=asked):
                asked.append(node.id)
                return builders.scratch_bytes(node, sources, provider)

            every = max((builders.scratch_bytes(op, [ops[s] for s in op.inputs], provider) for op in ops.values() if op.kernel), default=0)
            assert scratch_per_lane(nodes, provider, rule) == (every + 255) // 256 * 256
            assert 0 < len(asked) < sum(op.kernel is not None for op in ops.values())


@pytest.mark.parametrize("tokens, block", [(1024, 256), (4096, 1024)])
@pytest.mark.parametrize("factor", [1.5, 6])
def test_a_training_steps_pinned_estimate_covers_what_its_plan_stores(tokens, block, factor):
    """The session sizes a training step's arena from `_remat_pinned_estimate` (the GPU page tables of what it
    pins): the plan must not store more, or it is planned a second time (`refit_arena`), and not much less
    (each GiB too many takes 2 MiB of arena). The inputs' estimate alone falls short here."""
    from frontend.workloads.llama.config import from_hf
    from frontend.workloads.llama.train import LoraSpec, build_training_step
    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from runtime.api import _pinned_estimate, _remat_pinned_estimate

    config = from_hf({"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
                      "num_key_value_heads": 4, "vocab_size": 4096, "dtype": "float16"}, "small")
    step = build_training_step(config, 1, tokens, LoraSpec(16, 32.0, ("q_proj", "k_proj", "v_proj", "o_proj")), block=block)
    arena = int(minimum_budget(step.graph) * factor)
    memgraph = compile_taskgraph(step.graph, arena, remat=True, inputs="host", start_on_gpu=step.activation_ids, verify=False)
    estimate = _remat_pinned_estimate(step.graph, arena)
    assert _pinned_estimate(step.graph) < memgraph.storage_bytes <= estimate <= 1.3 * memgraph.storage_bytes


def test_plan_within_a_training_steps_estimate_plans_it_once():
    """At the cuda backend's arena for the inputs' estimate the step is planned twice (its offloads pin
    more); with `remat` (`_remat_pinned_estimate`) once, within the same budget."""
    from frontend.workloads.llama.config import from_hf
    from frontend.workloads.llama.train import LoraSpec, build_training_step
    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from runtime.api import arena_budget, plan_within

    config = from_hf({"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
                      "num_key_value_heads": 4, "vocab_size": 4096, "dtype": "float16"}, "small")
    step = build_training_step(config, 1, 4096, LoraSpec(16, 32.0, ("q_proj", "k_proj", "v_proj", "o_proj")), block=1024)
    budget = 3 * minimum_budget(step.graph) + (256 << 20)  # room for the cuda backend's workspace
    compile_at = lambda arena: compile_taskgraph(step.graph, arena, remat=True, inputs="host", start_on_gpu=step.activation_ids, verify=False)
    _, twice = plan_within(step.graph, budget, compile_at, "cuda", attention="cublas")
    memgraph, again = plan_within(step.graph, budget, compile_at, "cuda", attention="cublas", remat=True)
    assert twice and not again
    assert memgraph.budget <= arena_budget(memgraph, budget, "cuda", attention="cublas")
