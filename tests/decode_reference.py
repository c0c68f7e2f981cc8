"""The decode step as it was written by hand on the TaskGraph builder, kept as an oracle for its lowering.

frontend/workloads/llama/decode.py now lowers the decode step from the prefill's own decoder layer
(graph.py `_layer`, a `Program`). The step runs every token, so that lowering must give the very graph
this builder gave: tests/test_decode_lowering.py compares the two task by task (kernel, attributes,
operand shapes, output shape, GPU) and their plans' makespans in the sim. It shares no lowering code with
decode.py; it reads only the cut both agree on (the step's cache columns, the LM head's blocks and their
input ids). A deliberate change of the decode step's graph changes this oracle with it.
"""

from __future__ import annotations

from frontend.workloads.llama.config import LlamaConfig
from frontend.program import block_id
from frontend.workloads.llama.decode import head_blocks
from frontend.workloads.llama.weights import head_name
from turnip_ir.taskgraph import TaskGraph, Tensor


def reference_decode_graph(config: LlamaConfig, lengths: tuple[int, ...], columns: list[tuple[int, int]], gpus: int,
                           kv_block: int) -> TaskGraph:
    """The hand-written step of sequences with `lengths` cached tokens reading cache `columns`."""
    graph = TaskGraph(gpus)
    builder = _Builder(config, graph, lengths, kv_block, columns)
    x = graph.input((len(lengths), config.hidden_size), config.dtype, device=0, id="hidden")
    for layer in range(config.num_hidden_layers):
        x = builder.layer(x, layer)
    builder.head(x)
    return graph


class _Builder:
    """Builds one step's tasks, each layer on its pipeline GPU, moving tensors to it once."""

    def __init__(self, config: LlamaConfig, graph: TaskGraph, lengths: tuple[int, ...], kv_block: int, columns: list[tuple[int, int]]):
        self.config, self.graph, self.lengths, self.kv_block, self.columns = config, graph, lengths, kv_block, columns
        self.moves: dict[tuple[str, int], Tensor] = {}
        shape = (len(lengths), config.head_dim)
        self.rope = [graph.input(shape, config.dtype, device=0, id=f"rope.{f}") for f in ("cos", "sin")]
        self.lengths_input = graph.input((len(lengths),), "float32", device=0, id="kv.lengths")
        self.gpu = 0

    def on(self, t: Tensor) -> Tensor:
        """`t` on the current GPU, moved there once."""
        if t.device == self.gpu:
            return t
        key = (t.id, self.gpu)
        if key not in self.moves:
            self.moves[key] = self.graph.move(t, self.gpu, id=f"{t.id}.to{self.gpu}")
        return self.moves[key]

    def weight(self, name: str, shape: tuple[int, ...]) -> Tensor:
        return self.graph.input(shape, self.config.dtype, device=self.gpu, id=name)

    def kernel(self, name: str, *xs: Tensor, id: str, **attrs) -> Tensor:
        return self.graph.kernel(name, *(self.on(x) for x in xs), device=self.gpu, id=id, **attrs)

    def project(self, h: Tensor, name: str, shape: tuple[int, int], id: str) -> Tensor:
        return self.kernel("einsum", h, self.weight(name, shape), id=id, equation="ti,oi->to")

    def project_bias(self, h: Tensor, name: str, shape: tuple[int, int], id: str) -> Tensor:
        """`name`.weight's projection, plus `name`.bias broadcast over the rows when the family has one (qwen2)."""
        if not self.config.qkv_bias:
            return self.project(h, name + ".weight", shape, id)
        product = self.project(h, name + ".weight", shape, id + ".w")
        return self.kernel("add", product, self.weight(name + ".bias", shape[:1]), id=id)

    def layer(self, x: Tensor, layer: int) -> Tensor:
        """One decoder layer on the residual stream `x` [B, hidden]; returns the new stream."""
        c = self.config
        self.gpu = layer * self.graph.devices // c.num_hidden_layers
        p, n = f"model.layers.{layer}.", f"l{layer}."
        hidden, inner = c.hidden_size, c.intermediate_size
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        h = self.kernel("rmsnorm", x, self.weight(p + "input_layernorm.weight", (hidden,)), id=n + "attn_norm", eps=c.rms_norm_eps)
        q = self.project_bias(h, p + "self_attn.q_proj", (q_width, hidden), n + "q")
        k = self.project_bias(h, p + "self_attn.k_proj", (kv_width, hidden), n + "k")
        v = self.project_bias(h, p + "self_attn.v_proj", (kv_width, hidden), f"v_new.{layer}")
        q = self.kernel("rope", q, *self.rope, id=n + "q_rope")
        k = self.kernel("rope", k, *self.rope, id=f"k_new.{layer}")
        self.graph.output(k, v)
        a = self.attention(q, k, v, layer)
        o = self.project(a, p + "self_attn.o_proj.weight", (hidden, q_width), n + "o")
        x = self.kernel("add", x, o, id=n + "attn_res")
        h = self.kernel("rmsnorm", x, self.weight(p + "post_attention_layernorm.weight", (hidden,)), id=n + "mlp_norm", eps=c.rms_norm_eps)
        gate = self.project(h, p + "mlp.gate_proj.weight", (inner, hidden), n + "gate")
        up = self.project(h, p + "mlp.up_proj.weight", (inner, hidden), n + "up")
        act = self.kernel("swiglu", gate, up, id=n + "act")
        down = self.project(act, p + "mlp.down_proj.weight", (hidden, inner), n + "down")
        return self.kernel("add", x, down, id=n + "mlp_res")

    def attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
        """One decode_attention link per cache column for the whole batch, closed by the sequences' own keys."""
        c, n = self.config, f"l{layer}."
        attrs = {"heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads}
        if c.sliding_window is not None:
            attrs["window"] = c.sliding_window
        kv_width = c.num_key_value_heads * c.head_dim
        lengths = self.on(self.lengths_input)
        prev = None
        for start, rows in self.columns:
            j = start // self.kv_block
            kc, vc = (self.graph.input((rows, len(self.lengths), kv_width), c.dtype, device=self.gpu, id=f"kv.{layer}.{which}[{j}]") for which in "kv")
            operands = (q, kc, vc, lengths) if prev is None else (q, kc, vc, lengths, prev)
            prev = self.kernel("decode_attention", *operands, id=f"{n}attn.{j}", final=False, start=start, **attrs)
        operands = (q, k, v, lengths) if prev is None else (q, k, v, lengths, prev)
        return self.kernel("decode_attention", *operands, id=n + "attn", own=True, **attrs)

    def head(self, x: Tensor) -> None:
        """The final RMSNorm on the last GPU, then the LM head in blocks of vocabulary rows, block j on GPU j % gpus."""
        c = self.config
        self.gpu = self.graph.devices - 1
        h = self.kernel("rmsnorm", x, self.weight("model.norm.weight", (c.hidden_size,)), id="final_norm", eps=c.rms_norm_eps)
        for j, (start, stop) in enumerate(head_blocks(c)):
            self.gpu = j % self.graph.devices
            block = self.graph.input((stop - start, c.hidden_size), c.dtype, device=self.gpu, id=block_id(head_name(c), (len(head_blocks(c)), 1), (j, 0)))
            self.graph.output(self.kernel("einsum", h, block, id=f"logits[{j}]", equation="ti,oi->to"))
