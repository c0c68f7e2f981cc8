"""Reverse-mode autodiff of frontend Programs (frontend/autodiff.py) and the training kernels.

Kernels: each new kernel of the cpu backend equals its float64 formula (tests/kernel_formulas.py), and the
formulas of the backward kernels equal float64 finite differences of the forward formulas they invert.
Programs: hypothesis draws chains of ops (projections with split contractions, biases, residuals,
scale, mul, rmsnorm, rope, swiglu, blocked attention with GQA, windows and sequences) cut into random
blocks, ending in the blocked cross-entropy or a random cotangent; the gradients the backward pass
computes (the taskgraph evaluated by the float64 formulas) equal central differences of the loss along
random directions, and the cpu backend runs the same plan, under a budget that forces offload in a
random order, to the same numbers. Frozen inputs get no gradient task; what has no rule is refused in
one line; the cuda backend refuses a kernel it has no implementation of in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_formulas import FORMULAS, apply, evaluate

from frontend import Program
from frontend.autodiff import grad
from frontend.loss import IGNORE, mean_loss
from frontend.workloads.llama.config import from_hf
from frontend.workloads.llama.train import LoraSpec, build_training_step
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from runtime import execute
from runtime.kernels_numpy import NUMPY_KERNELS
from tests.formulas_llama import rope_tables
from turnip_ir.errors import InputError, KernelError
from turnip_ir.kernels import KERNELS

HEADS, WIDTH, VOCAB = 2, 8, 6
"""Attention over two heads of 4; projections are [8, 8]; the cross-entropy's vocabulary has 6 words."""


# ----- kernels ------------------------------------------------------------------------------------------


def _packed(q, k, v, attrs):
    """The forward's final packed partial of one key block (the formula's), as the backward reads it."""
    return apply("attention", [q, k, v], {**attrs, "final": False}).astype(np.float32)


def _run(name, xs, attrs):
    shape, dtype = KERNELS[name].infer([x.shape for x in xs], [str(x.dtype) for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS[name](xs, out, attrs)
    return out


@pytest.mark.parametrize("wrt", ["q", "kv"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("masks", [{"causal": True}, {}, {"window": 3, "offset": -2}, {"causal": True, "window": 2}])
@pytest.mark.parametrize("with_prev", [False, True])
def test_cpu_attention_grad_equals_its_formula(wrt, heads, kv_heads, masks, with_prev):
    rng = np.random.default_rng(heads + kv_heads)
    tokens, width = 5, 3
    q, d_out = (rng.standard_normal((tokens, heads * width)) for _ in range(2))
    k, v = (rng.standard_normal((tokens, kv_heads * width)) for _ in range(2))
    attrs = {"heads": heads, "kv_heads": kv_heads, "wrt": wrt, **masks}
    xs = [q, k, v, _packed(q, k, v, {"heads": heads, "kv_heads": kv_heads, **masks}), d_out]
    if with_prev:
        shape = q.shape if wrt == "q" else (2 * tokens, k.shape[1])
        xs.append(rng.standard_normal(shape))
    np.testing.assert_allclose(_run("attention_grad", xs, attrs), apply("attention_grad", xs, attrs), rtol=1e-10, atol=1e-10)


def test_attention_grad_formula_equals_finite_differences():
    """Over one causal key block the packed partial is the whole softmax: the formula's dq, dk and dv are
    the derivatives of <d_out, attention(q, k, v)>."""
    rng = np.random.default_rng(0)
    attrs = {"heads": 4, "kv_heads": 2, "causal": True}
    q, d_out = (rng.standard_normal((5, 12)) for _ in range(2))
    k, v = (rng.standard_normal((5, 6)) for _ in range(2))
    packed = apply("attention", [q, k, v], {**attrs, "final": False})
    dq = apply("attention_grad", [q, k, v, packed, d_out], {**attrs, "wrt": "q"})
    dk, dv = np.split(apply("attention_grad", [q, k, v, packed, d_out], {**attrs, "wrt": "kv"}), 2)
    for position, analytic in enumerate((dq, dk, dv)):
        direction = rng.standard_normal(analytic.shape)

        def value(step, position=position, direction=direction):
            xs = [q, k, v]
            xs[position] = xs[position] + step * direction
            return (d_out * apply("attention", xs, attrs)).sum()

        numeric = (value(1e-6) - value(-1e-6)) / 2e-6
        assert abs(numeric - (analytic * direction).sum()) <= 1e-7 * (1 + abs(numeric))


def _xent_inputs(rng, dtype, tokens=5, vocab=7):
    logits = rng.standard_normal((tokens, vocab)).astype(dtype)
    labels = np.array([3, IGNORE, 0, 12, 6][:tokens], dtype=np.float32)  # 12: another block's column
    return logits, labels


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cpu_cross_entropy_kernels_equal_their_formulas(dtype):
    rng = np.random.default_rng(1)
    logits, labels = _xent_inputs(rng, dtype)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == "float64" else {"rtol": 2e-6, "atol": 2e-6}
    first = _run("xent", [logits, labels], {})
    np.testing.assert_allclose(first, apply("xent", [logits, labels], {}), **tol)
    second = _run("xent", [logits, labels, first], {"start": 7})
    np.testing.assert_allclose(second, apply("xent", [logits, labels, first], {"start": 7}), **tol)
    total = _run("xent_loss", [second, labels], {})
    np.testing.assert_allclose(total, apply("xent_loss", [second, labels], {}), **tol)
    attrs = {"start": 7, "factor": 3.0}
    for scale in ([], [np.array([0.25], dtype=second.dtype)]):
        xs = [logits, labels, second, total, *scale]
        np.testing.assert_allclose(_run("xent_grad", xs, attrs), apply("xent_grad", xs, attrs), **tol)


def test_the_cross_entropy_chain_is_the_loss_over_the_whole_vocabulary():
    """Two vocabulary blocks chained equal one softmax over their 14 columns, label 12 in the second."""
    rng = np.random.default_rng(2)
    left, labels = _xent_inputs(rng, "float64")
    right = rng.standard_normal(left.shape)
    stats = apply("xent", [right, labels, apply("xent", [left, labels], {})], {"start": 7})
    total = apply("xent_loss", [stats, labels], {})
    whole = np.concatenate([left, right], axis=1)
    kept = labels != IGNORE
    lse = np.log(np.exp(whole).sum(axis=1))
    want = (lse - whole[np.arange(5), np.where(kept, labels, 0).astype(int)])[kept]
    np.testing.assert_allclose(total, [want.sum(), kept.sum()], rtol=1e-12)


@pytest.mark.parametrize("name, shapes, attrs", [
    ("rmsnorm_grad", [(3, 4), (4,), (3, 4)], {"eps": 1e-5}),
    ("swiglu_grad", [(3, 4), (3, 4), (3, 4)], {}),
])
def test_elementwise_grad_formulas_equal_finite_differences(name, shapes, attrs):
    """rmsnorm_grad and swiglu_grad are the derivatives of <dy, rmsnorm(x, w)> and <dy, silu(gate) * up>."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s) + (1.0 if len(s) == 1 else 0.0) for s in shapes]
    forward = name.removesuffix("_grad")
    direction = rng.standard_normal(shapes[0])

    def value(step):
        return (xs[-1] * apply(forward, [xs[0] + step * direction, *xs[1:-1]], attrs)).sum()

    numeric = (value(1e-6) - value(-1e-6)) / 2e-6
    assert abs(numeric - (apply(name, xs, attrs) * direction).sum()) <= 1e-7 * (1 + abs(numeric))


def test_cast_and_unpack_kernels():
    packed = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(_run("attention_unpack", [packed], {"heads": 2, "dtype": "float16"}), packed[:, :4])
    assert _run("cast", [packed], {"dtype": "float64"}).dtype == np.float64
    assert set(FORMULAS) >= {"cast", "attention_unpack"}


# ----- random programs against finite differences ------------------------------------------------------


class Chain:
    """A random program: a residual stream h [T, 8] through `ops`, then a loss; inputs drawn by `values`."""

    def __init__(self, tokens: int, t_split, f_split: int, ops: list[str], end: str, seed: int,
                 window: int | None, sequences: bool):
        self.prog = Program(1, order_by=("t",), training=True)
        self.tokens, self.t_split, self.f_split, self.window = tokens, t_split, f_split, window
        self.sequences = (tokens // 2, tokens // 2) if sequences else None
        self.shapes: dict[str, tuple] = {}
        self.weights: list = []
        prog = self.prog
        h = self.input("x", (tokens, WIDTH), (t_split, f_split), weight=True)
        rope = [self.input(f"rope.{f}", (tokens, 4), (t_split,)) for f in ("cos", "sin")]
        for n, op in enumerate(ops):
            prog.phase = n
            h = getattr(self, op)(h, n, rope)
        prog.phase = len(ops)
        if end == "cross_entropy":
            head = self.input("head", (VOCAB, WIDTH), (2, f_split), weight=True)
            logits = prog.einsum("ti,vi->tv", h, head, name="logits")
            labels = self.input("labels", (tokens,), (t_split,), dtype="float32")
            self.loss = prog.cross_entropy(logits, labels, name="loss")
            self.seed = 1.7 if seed % 2 else self.input("scale", (1,), ())  # a number, or a tensor fed as data
        else:
            self.loss, self.seed = h, self.input("cotangent", h.shape, h.splits)
            prog.output(h)
        self.rng = np.random.default_rng(seed)

    def input(self, name, shape, splits, weight=False, dtype="float64"):
        x = self.prog.input(name, shape, dtype, splits)
        self.shapes[name] = shape
        if weight:
            self.weights.append(x)
        return x

    def project(self, h, name, rows=WIDTH, split=None):
        w = self.input(f"{name}.w", (rows, WIDTH), (split or self.f_split, self.f_split), weight=True)
        return self.prog.einsum("ti,oi->to", h, w, name=name)

    def proj(self, h, n, rope):
        return self.project(h, f"p{n}")

    def bias(self, h, n, rope):
        b = self.input(f"b{n}", (WIDTH,), (self.f_split,), weight=True)
        return self.prog.map("add", h, b, name=f"bias{n}", signature="tn,n->tn")

    def residual(self, h, n, rope):
        return self.prog.map("add", h, self.project(h, f"r{n}"), name=f"res{n}", signature="tn,tn->tn")

    def scale(self, h, n, rope):
        return self.prog.map("scale", h, name=f"s{n}", factor=-0.7)

    def mul(self, h, n, rope):
        g = self.input(f"g{n}", (WIDTH,), (self.f_split,), weight=True)
        return self.prog.map("mul", h, g, name=f"mul{n}", signature="tn,n->tn")

    def rmsnorm(self, h, n, rope):
        if self.f_split > 1:
            return self.scale(h, n, rope)
        w = self.input(f"nw{n}", (WIDTH,), (), weight=True)
        return self.prog.map("rmsnorm", h, w, name=f"norm{n}", signature="th,h->th", eps=1e-5)

    def rope(self, h, n, rope):
        return self.prog.map("rope", h, *rope, name=f"rope{n}", signature="tn,td,td->tn")

    def swiglu(self, h, n, rope):
        gate, up = self.project(h, f"gate{n}"), self.project(h, f"up{n}")
        return self.prog.map("swiglu", gate, up, name=f"act{n}", signature="tf,tf->tf")

    def attention(self, h, n, rope):
        kv_heads = 1 if self.f_split == 1 and n % 2 else HEADS
        q = self.project(h, f"q{n}")
        k, v = (self.project(h, f"{x}{n}", rows=kv_heads * 4) for x in "kv")
        q, k = (self.prog.map("rope", x, *rope, name=f"{x.name}.rope", signature="tn,td,td->tn") for x in (q, k))
        return self.prog.attention(q, k, v, name=f"attn{n}", heads=HEADS, kv_heads=kv_heads, window=self.window,
                                   sequences=self.sequences)

    def values(self) -> dict[str, np.ndarray]:
        values = {name: self.rng.standard_normal(shape) for name, shape in self.shapes.items()}
        for x in self.weights[1:]:  # projections N(0, 1/fan-in), as a model's: softmaxes that do not saturate
            values[x.name] /= np.sqrt(x.shape[-1]) if len(x.shape) == 2 else 1.0
        values["rope.cos"], values["rope.sin"] = rope_tables(self.tokens, 4, theta=10.0)
        if "labels" in values:
            values["labels"] = self.rng.integers(0, VOCAB, self.tokens).astype(np.float32)
            values["labels"][:: 3] = IGNORE
        return values

    def loss_value(self, outputs) -> float:
        if self.loss.name != "loss":
            return float((self.prog.gather(self.loss, outputs) * self.values_now["cotangent"]).sum())
        seed = self.seed if isinstance(self.seed, float) else self.values_now["scale"][0]
        return seed * mean_loss(self.prog.gather(self.loss, outputs))


OPS = ["proj", "bias", "residual", "scale", "mul", "rmsnorm", "rope", "swiglu", "attention"]


@st.composite
def chains(draw):
    tokens = draw(st.sampled_from([4, 6]))
    sequences = draw(st.booleans())
    half = tokens // 2
    t_split = draw(st.sampled_from([(half, half), (1, half - 1, half)] if sequences else [1, 2, 3, (1, tokens - 1)]))
    return {"tokens": tokens, "t_split": t_split, "f_split": draw(st.sampled_from([1, 2])),
            "ops": draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=4)),
            "end": draw(st.sampled_from(["cross_entropy", "cotangent"])), "seed": draw(st.integers(0, 1000)),
            "window": draw(st.sampled_from([None, 2, 3])), "sequences": sequences}


def _build(spec, recompute=()):
    chain = Chain(**spec)
    wrt = [x for n, x in enumerate(chain.weights) if (spec["seed"] >> n) % 3 or n == len(chain.weights) - 1]
    chain.forward_ids = set(chain.prog.graph.nodes)
    grads = grad(chain.prog, chain.loss, wrt, seed=chain.seed, recompute=recompute)
    chain.prog.output(chain.loss, *grads.values())
    chain.prog.taskgraph()
    return chain, grads


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_gradients_of_random_programs_equal_finite_differences(spec):
    chain, grads = _build(spec)
    values = chain.values()
    chain.values_now = values
    analytic = evaluate(chain.prog.graph, chain.prog.feed(values))
    for name, g in grads.items():
        direction = chain.rng.standard_normal(chain.shapes[name])

        def value(step, name=name, direction=direction):
            moved = dict(values, **{name: values[name] + step * direction})
            return chain.loss_value(evaluate(chain.prog.graph, chain.prog.feed(moved)))

        numeric = (value(1e-5) - value(-1e-5)) / 2e-5
        exact = float((chain.prog.gather(g, analytic) * direction).sum())
        assert abs(numeric - exact) <= 1e-6 * (1 + abs(exact)), f"{name}: {numeric} != {exact}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.integers(0, 3))
def test_the_cpu_backend_runs_the_backward_pass_under_offload(spec, order_seed):
    """The same outputs as the float64 formulas (float32 attention partials: to 1e-5), under a budget a
    little above the least one, in random orders, identical bit for bit across orders."""
    chain, _ = _build(spec)
    graph = chain.prog.graph
    values = chain.values()
    inputs = chain.prog.feed(values)
    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * 1.3), remat=order_seed % 2 == 1)
    runs = [execute(memgraph, "cpu", order="random", seed=order_seed + n, inputs=inputs).outputs for n in range(2)]
    want = evaluate(graph, inputs)
    for task, expected in want.items():
        np.testing.assert_array_equal(runs[0][task], runs[1][task])
        np.testing.assert_allclose(runs[0][task], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.data())
def test_recomputing_any_phases_gives_the_same_gradients_and_keeps_nothing_of_them_for_the_backward(spec, data):
    """`grad(recompute=)`: the phases named compute their forward again before their backward; the
    gradients equal those of the plain pass bit for bit (the float64 formulas and the cpu backend under
    offload, in a random order), and no backward task reads what such a phase made in the forward but
    what later phases read of it (their boundary)."""
    phases = data.draw(st.sets(st.integers(0, len(spec["ops"]) - 1)), label="recompute")
    plain, grads = _build(spec)
    again, grads_again = _build(spec, recompute=phases)
    values = plain.values()
    want = evaluate(plain.prog.graph, plain.prog.feed(values))
    graph = again.prog.graph
    inputs = again.prog.feed(values)
    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * 1.3))
    same = evaluate(graph, inputs)
    got = execute(memgraph, "cpu", order="random", seed=data.draw(st.integers(0, 9), label="order"), inputs=inputs).outputs
    for name, g in grads.items():
        expected = plain.prog.gather(g, want)
        np.testing.assert_array_equal(again.prog.gather(grads_again[name], same), expected)
        np.testing.assert_allclose(again.prog.gather(grads_again[name], got), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    readers: dict[str, set[str]] = {}
    for node in graph.nodes.values():
        for source in node.inputs:
            readers.setdefault(source, set()).add(node.id)
    steps = [step for step in again.prog.tape if step.kind not in ("input", "output")]
    forward = next(step.phase for step in steps if step.result is again.loss)  # the loss's: the last of the forward pass
    for step in steps:
        if step.phase not in phases or step.result.name.endswith(".again") or step.phase >= forward:
            continue  # the loss's own phase is not recomputed: its backward follows at once
        if any(x.name == step.result.name for later in steps if step.phase < later.phase <= forward for x in later.operands):
            continue  # a boundary: later phases of the forward read it, and so may their backward
        for block in step.result.blocks.values():
            assert readers.get(block.id, set()) <= again.forward_ids, f"{block.id} is read by the backward"


def test_a_recomputed_layer_count_out_of_range_is_refused_in_one_line():
    config = from_hf({"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 64, "model_type": "llama"}, "tiny")
    lora = LoraSpec(rank=2, alpha=4.0, targets=("q_proj",))
    for bad in (-1, 3, True, 1.5):
        with pytest.raises(InputError, match="recompute must be a layer count from 0 to 2"):
            build_training_step(config, 1, 8, lora, recompute=bad)


# ----- what is and is not built ------------------------------------------------------------------------


def test_frozen_inputs_get_no_gradient_tasks():
    """Only the LM head is trained: the backward pass is its logits' gradient and its own, nothing for the
    [8, 8] projections before it or the stream they make."""
    chain, grads = _build({"tokens": 4, "t_split": 2, "f_split": 1, "ops": ["proj", "swiglu", "proj"],
                           "end": "cross_entropy", "seed": 0, "window": None, "sequences": False})
    assert list(grads) == ["head"]
    backward = [node for node in chain.prog.graph.nodes.values() if node.id.startswith("d")]
    assert {node.op for node in backward} == {"xent_grad", "einsum", "add"}
    assert all(node.shape != (WIDTH, WIDTH) for node in chain.prog.graph.nodes.values() if node.op != "input")


def test_a_split_contraction_of_a_gradient_sums_float32_partials():
    prog = Program(1)
    x = prog.input("x", (6, 4), "float16", (3,))
    w = prog.input("w", (5, 4), "float16")
    y = prog.einsum("ti,oi->to", x, w, name="y")
    seed = prog.input("seed", (6, 5), "float16", (3,))
    dw = grad(prog, y, [w], seed=seed, dtype="float32")["w"]
    assert dw.dtype == "float32"
    ops = [node.op for node in prog.graph.nodes.values() if node.id.startswith("d1.y")]
    assert ops.count("cast") == 3 and ops.count("add") == 2
    assert all(prog.graph.nodes[i].dtype == "float32" for node in prog.graph.nodes.values() if node.op == "add" for i in node.inputs)


def test_what_has_no_rule_is_refused_in_one_line():
    prog = Program(1)
    x = prog.input("x", (4, 4), "float64")
    y = prog.map("relu", x, name="y")
    with pytest.raises(InputError, match="map 'y': kernel 'relu' has no gradient rule"):
        grad(prog, y, [x], seed=prog.input("seed", (4, 4), "float64"))
    prog = Program(1)
    q, k, v = (prog.input(n, (4, 4), "float64") for n in "qkv")
    out = prog.attention(q, k, v, name="attn", heads=1, kv_heads=1)
    with pytest.raises(InputError, match="training=True"):
        grad(prog, out, [q], seed=prog.input("seed", (4, 4), "float64"))
    with pytest.raises(InputError, match="'w' is not an input"):
        grad(prog, out, [out.__class__("w", (1,), "float64", ((1,),))], seed=1.0)


def test_cuda_refuses_a_kernel_it_has_no_implementation_of_in_one_line(monkeypatch):
    """Every training kernel has one now (tests/test_cuda_train.py); the refusal is for the next kernel."""
    from runtime.backends.cuda import CudaBackend, builders

    monkeypatch.delitem(builders.BUILDERS, "xent")
    assert builders.missing_kernels() == ["xent"]
    chain, _ = _build({"tokens": 4, "t_split": 2, "f_split": 1, "ops": ["proj"], "end": "cross_entropy", "seed": 0,
                       "window": None, "sequences": False})
    memgraph = compile_taskgraph(chain.prog.graph, 1 << 20)
    with pytest.raises(KernelError, match=r"kernel 'xent' has no cuda implementation .* run it with --backend cpu$"):
        execute(memgraph, CudaBackend(), inputs=chain.prog.feed(chain.values()))
