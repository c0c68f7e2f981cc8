"""Reverse-mode differentiation of a frontend `Program`: its tape read backwards, each step's backward rule
lowered by the same partitions into blocked tasks of the same taskgraph.

`grad(prog, loss, wrt, seed=1.0, dtype=None)` appends the backward pass of `loss` to `prog` and returns
the gradient of each input in `wrt`, by name, as `Blocked` tensors cut like the inputs (mark them as
outputs to read them). The seed is d(loss value): a float when `loss` is a cross-entropy (`Program.cross_entropy`,
whose value is the mean loss; the factor a loss scale multiplies in), else a `Blocked` cotangent cut like
`loss` (the pass then computes the vector-Jacobian product). A cross-entropy's seed may also be a
tensor [1] in its statistics' dtype (a loss scale fed as data: one plan for every scale). With `dtype`, the `wrt` gradients are summed
and returned in that dtype (float32 for half models: a split contraction's partial products are cast to
it before they are added).

State while it runs (`Backward`): the program, the gradient contributions of each tensor (by name, summed
by a tree of adds when the tensor's own step is reached, so every consumer's share is in), and the names
that need a gradient: those that depend on a `wrt` input. Nothing is computed for the others, so an input
not in `wrt` (a frozen weight) gets no gradient task and no buffer.
Rules, one per step kind, each given the step, the gradient of its result and the operands that need one:
- einsum: operand k's gradient is the einsum of the result's gradient and the other operands into k's
  letters (the equation permuted); a contracted letter that is split becomes a sum tree, as in any einsum.
  An operand that repeats a letter, or has one that nothing else carries, has no rule (one-line error);
- map: add and sub (a reduction over the letters an operand lacks: a bias's gradient sums the tokens),
  mul, scale, cast; rmsnorm (`rmsnorm_grad`; its weight's gradient, when wanted, sums dy * rmsnorm(x) over
  the tokens); rope (rope with the sin table negated, computed once per table: the tables repeat their
  halves, so that is the rotation's transpose); swiglu (`swiglu_grad` for the gate, `swiglu(gate, dy)`
  for up: two tasks that each write one result, cheaper than a packed pair cut apart by copies);
- attention: frontend/attention.py `lower_grad` (flash attention's backward from the saved log-sum-exp);
- cross_entropy: frontend/loss.py `lower_grad`, seeded by the seed (a number or a tensor [1]).
Other map kernels have no rule yet (one-line error naming the op and the kernel).
Order: the backward of a step written at phase p is keyed at phase top + 1 + (top - p), so the taskgraph
order (`Program.taskgraph`) runs the layers' backward passes in reverse, block by block inside each.
Names: operand k's gradient from the step of result R is `d{k}.{R}`; the sum of a tensor X's is `d.{X}`.
Recompute (`grad(recompute=phases)`): a named phase's steps that its backward reads (a product's other
operand, a norm's input, a gating's, attention's q, k, v and packed partial), with those they need of the
same phase, are written again as `{R}.again`, keyed just before the phase's backward, and its rules read
the copies: the forward's own results then die inside the forward pass, and only what the phase read of
earlier phases (a layer's input) lives until its backward. The gradients are the same bit for bit; the
GPU computes those steps twice. turnip/recompute.py chooses, by the sim, how many layers a LLaMA step
recomputes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from frontend import attention
from frontend.loss import lower_grad as cross_entropy_grad
from frontend.placement import follow
from frontend.program import Blocked, Program, Step
from turnip_ir.errors import InputError
from turnip_ir.kernels import parse_equation


@dataclass
class Backward:
    """The state of one `grad` call (module docstring)."""

    prog: Program
    wrt: set[str]
    needs: set[str]
    dtype: str | None
    seed: float | Blocked | None = None
    parts: dict[str, list[Blocked]] = field(default_factory=dict)
    negated: dict[str, Blocked] = field(default_factory=dict)

    def total(self, x: Blocked) -> Blocked | None:
        """The gradient of `x`: its contributions summed pairwise (None when it has none)."""
        parts = self.parts.get(x.name, [])
        count = 0
        while len(parts) > 1:
            last = len(parts) == 2
            summed = [self.prog.map("add", a, b, name=f"d.{x.name}" if last else f"d.{x.name}.s{count + n}", place=follow)
                      for n, (a, b) in enumerate(zip(parts[::2], parts[1::2]))]
            count += len(summed)
            parts = summed + parts[len(parts) // 2 * 2:]
        self.parts[x.name] = parts
        return parts[0] if parts else None

    def acc(self, x: Blocked) -> str | None:
        """The dtype `x`'s gradient is summed in: `dtype` for a `wrt` input, else its own."""
        return self.dtype if x.name in self.wrt else None


def grad(prog: Program, loss: Blocked, wrt: Sequence[Blocked], seed: float | Blocked = 1.0,
         dtype: str | None = None, recompute: Collection[int] = ()) -> dict[str, Blocked]:
    """Append the backward pass of `loss` to `prog`; the gradient of each `wrt` input, by name (module docstring).
    `recompute`: phases whose forward is computed again just before their backward (`_replay`), from what
    the phase read of other phases, so that nothing it made is kept from the forward pass for the backward
    (the loss's own phase never is: its backward follows it at once)."""
    for x in wrt:
        if prog.inputs.get(x.name) is not x:
            raise InputError(f"grad: '{x.name}' is not an input of the program")
    state = Backward(prog, {x.name for x in wrt}, _needs(prog.tape, {x.name for x in wrt}), dtype)
    source = next((step for step in prog.tape if step.result is loss and step.kind != "output"), None)
    if source is None or loss.name not in state.needs:
        raise InputError(f"grad: '{loss.name}' does not depend on {', '.join(sorted(state.wrt)) or 'any input'}")
    _seed(state, source, seed)
    top = max(step.phase for step in prog.tape)
    again: dict[str, Step] = {}  # a recomputed phase's step by its result's name: its copy (`_replay`)
    replayed = set()
    for step in reversed(prog.tape):
        if step.kind in ("input", "output"):
            continue
        wanted = {k: f"d{k}.{step.result.name}" for k, x in enumerate(step.operands) if x.name in state.needs}
        if step.phase in recompute and step.phase not in replayed and step.phase != source.phase:
            replayed.add(step.phase)
            prog.phase, prog.group = top + 1 + top - step.phase - 0.5, 1  # keyed just before the phase's backward
            again |= _replay(state, step.phase)
        prog.phase, prog.group = top + 1 + top - step.phase, 1
        dy = state.total(step.result)
        if (dy is None and step is not source) or not wanted:
            continue
        for k, g in RULES[step.kind](state, _reading(step, again), dy, wanted).items():
            x = step.operands[k]
            if state.acc(x) and g.dtype != state.acc(x):
                g = prog.map("cast", g, name=f"{wanted[k]}.{state.acc(x)}", dtype=state.acc(x))
            state.parts.setdefault(x.name, []).append(g)
    grads = {x.name: state.total(x) for x in wrt}
    for name, g in grads.items():
        if g is None:
            raise InputError(f"grad: '{loss.name}' does not depend on input '{name}'")
    return grads


def _replay(state: Backward, phase: int) -> dict[str, Step]:
    """The steps of `phase` that its backward reads (`_reads`), and those they need of the same phase,
    written again under new names (`<name>.again`) from the same operands of other phases: the copies'
    steps by their originals' result names."""
    prog = state.prog
    steps = [step for step in prog.tape if step.phase == phase and step.kind not in ("input", "output")]
    made = {step.result.name: step for step in steps}
    wanted = set()
    for step in steps:
        if step.result.name in state.needs:
            wanted |= {name for name in _reads(step, state.needs) if name in made}
    for step in reversed(steps):  # what a wanted step reads of the phase is wanted too
        if step.result.name in wanted:
            wanted |= {x.name for x in step.operands if x.name in made}
    again: dict[str, Step] = {}
    for step in steps:
        if step.result.name in wanted:
            REPLAY[step.kind](prog, _reading(step, again))
            again[step.result.name] = prog.tape[-1]
    return again


def _reads(step: Step, needs: set[str]) -> set[str]:
    """The names of what `step`'s backward rules read (beside the result's gradient), for the operands in
    `needs`: an einsum's or a product's other operands, a norm's and a gating's operands, rope's tables,
    attention's q, k, v and packed partial; nothing for a sum, a scale or a cast."""
    names = [x.name for x in step.operands]
    if step.kind == "attention":  # its own packed partial: the step itself
        return {*names, step.result.name}
    kernel = step.attrs.get("kernel") if step.kind == "map" else None
    if kernel in ("add", "sub", "scale", "cast"):
        return set()
    if kernel == "rope":
        return set(names[1:])
    if step.kind == "einsum" or kernel == "mul":
        return {name for k, name in enumerate(names) if any(other in needs for n, other in enumerate(names) if n != k)}
    return set(names)


def _reading(step: Step, again: Mapping[str, Step]) -> Step:
    """`step` reading the recomputed copies (`again`) of its operands and packed partial where there are."""
    if not again:
        return step
    operands = tuple(again[x.name].result if x.name in again else x for x in step.operands)
    attrs = step.attrs
    if step.kind == "attention" and step.result.name in again:  # its backward reads the copy's packed partial
        attrs = {**attrs, "packed": again[step.result.name].attrs["packed"]}
    return replace(step, operands=operands, attrs=attrs)


def _einsum_again(prog: Program, step: Step) -> None:
    _, out = parse_equation(step.attrs["equation"], len(step.operands))
    result = step.result
    acc = result.dtype if result.dtype != step.operands[0].dtype else None
    prog.einsum(step.attrs["equation"], *step.operands, name=f"{result.name}.again", place=step.place, acc=acc,
                splits=dict(zip(out, result.splits)))


def _map_again(prog: Program, step: Step) -> None:
    signature = ",".join(step.attrs["ins"]) + "->" + step.attrs["out"]
    prog.map(step.attrs["kernel"], *step.operands, name=f"{step.result.name}.again", signature=signature, place=step.place,
             **step.attrs["attrs"])


def _attention_again(prog: Program, step: Step) -> None:
    a = step.attrs
    prog.attention(*step.operands, name=f"{step.result.name}.again", heads=a["heads"], kv_heads=a["kv_heads"], place=step.place,
                   window=a["window"], sequences=a["sequences"])


REPLAY = {"einsum": _einsum_again, "map": _map_again, "attention": _attention_again}
"""Step kind -> writes the step again (`_replay`); a cross-entropy is the loss, never recomputed."""


def _needs(tape: list[Step], wrt: set[str]) -> set[str]:
    """The names of the tensors that depend on a `wrt` input (the inputs included)."""
    needs = set(wrt)
    for step in tape:
        if step.kind != "output" and any(x.name in needs for x in step.operands):
            needs.add(step.result.name)
    return needs


def _seed(state: Backward, source: Step, seed: float | Blocked) -> None:
    if source.kind == "cross_entropy":
        if isinstance(seed, Blocked) and (seed.shape != (1,) or seed.dtype != source.result.dtype):
            raise InputError(f"grad: the seed of cross-entropy '{source.result.name}' is d of its mean loss: a number "
                             f"or a {source.result.dtype} tensor [1], not {seed.dtype} {list(seed.shape)}")
        state.seed = seed if isinstance(seed, Blocked) else float(seed)
        return
    if not isinstance(seed, Blocked) or seed.shape != source.result.shape or seed.splits != source.result.splits:
        raise InputError(f"grad: the seed of '{source.result.name}' must be a tensor cut like it, "
                         f"{[list(s) for s in source.result.splits]}")
    state.parts[source.result.name] = [seed]


# ----- rules: (state, step, dy, wanted {operand: gradient name}) -> {operand: gradient} --------------------


def _einsum(state: Backward, step: Step, dy: Blocked, wanted: dict[int, str]) -> dict[int, Blocked]:
    ins, out = parse_equation(step.attrs["equation"], len(step.operands))
    grads = {}
    for k, name in wanted.items():
        x, letters = step.operands[k], ins[k]
        others = [(l, o) for n, (l, o) in enumerate(zip(ins, step.operands)) if n != k]
        carried = set(out).union(*(l for l, _ in others))
        if len(set(letters)) < len(letters) or not set(letters) <= carried:
            raise InputError(f"einsum '{step.result.name}': operand '{x.name}' ('{letters}') repeats an index or sums "
                             "one alone; there is no gradient rule for that")
        equation = ",".join([out] + [l for l, _ in others]) + "->" + letters
        grads[k] = state.prog.einsum(equation, dy, *(o for _, o in others), name=name, place=step.place, acc=state.acc(x))
    return grads


def _map(state: Backward, step: Step, dy: Blocked, wanted: dict[int, str]) -> dict[int, Blocked]:
    rule = MAP_RULES.get(step.attrs["kernel"])
    if rule is None:
        raise InputError(f"map '{step.result.name}': kernel '{step.attrs['kernel']}' has no gradient rule "
                         f"(rules: {', '.join(MAP_RULES)})")
    return {k: rule(state, step, dy, k, name) for k, name in wanted.items()}


def _reduce(state: Backward, step: Step, dy: Blocked, k: int, name: str) -> Blocked:
    """dy summed over the letters operand k lacks (dy itself when it has them all)."""
    letters, out = step.attrs["ins"][k], step.attrs["out"]
    if letters == out:
        return dy
    return state.prog.einsum(f"{out}->{letters}", dy, name=name, acc=state.acc(step.operands[k]))


def _add(state, step, dy, k, name):
    return _reduce(state, step, dy, k, name)


def _sub(state, step, dy, k, name):
    g = _reduce(state, step, dy, k, name + ".sum" if k else name)
    return g if k == 0 else state.prog.map("scale", g, name=name, factor=-1.0)


def _mul(state, step, dy, k, name):
    (ins, out), other = (step.attrs["ins"], step.attrs["out"]), step.operands[1 - k]
    equation = f"{out},{ins[1 - k]}->{ins[k]}"
    if ins[k] == out:
        return state.prog.map("mul", dy, other, name=name, signature=equation)
    return state.prog.einsum(equation, dy, other, name=name, acc=state.acc(step.operands[k]))


def _scale(state, step, dy, k, name):
    return state.prog.map("scale", dy, name=name, **step.attrs["attrs"])


def _cast(state, step, dy, k, name):
    return state.prog.map("cast", dy, name=name, dtype=step.operands[0].dtype)


def _rmsnorm(state, step, dy, k, name):
    (ins, out), x = (step.attrs["ins"], step.attrs["out"]), step.operands[0]
    if k == 0:
        signature = ",".join([*ins, out]) + "->" + out
        return state.prog.map("rmsnorm_grad", *step.operands, dy, name=name, signature=signature, **step.attrs["attrs"])
    normed = state.prog.map("rmsnorm", x, name=name + ".norm", **step.attrs["attrs"])
    return state.prog.einsum(f"{out},{out}->{ins[1]}", dy, normed, name=name, acc=state.acc(step.operands[1]))


def _rope(state, step, dy, k, name):
    _, cos, sin = step.operands
    if k:
        raise InputError(f"map '{step.result.name}': rope has no gradient rule for its tables ('{step.operands[k].name}')")
    if sin.name not in state.negated:
        state.negated[sin.name] = state.prog.map("scale", sin, name=f"{sin.name}.negated", factor=-1.0)
    ins, out = step.attrs["ins"], step.attrs["out"]
    return state.prog.map("rope", dy, cos, state.negated[sin.name], name=name, signature=f"{out},{ins[1]},{ins[2]}->{out}")


def _swiglu(state, step, dy, k, name):
    gate, up = step.operands
    out = step.attrs["out"]
    if k == 0:
        return state.prog.map("swiglu_grad", gate, up, dy, name=name, signature=f"{out},{out},{out}->{out}")
    return state.prog.map("swiglu", gate, dy, name=name, signature=f"{out},{out}->{out}")


MAP_RULES = {"add": _add, "sub": _sub, "mul": _mul, "scale": _scale, "cast": _cast, "rmsnorm": _rmsnorm,
             "rope": _rope, "swiglu": _swiglu}


def _attention(state: Backward, step: Step, dy: Blocked, wanted: dict[int, str]) -> dict[int, Blocked]:
    return attention.lower_grad(state.prog, step, dy, wanted)


def _cross_entropy(state: Backward, step: Step, dy: Blocked | None, wanted: dict[int, str]) -> dict[int, Blocked]:
    if dy is not None or state.seed is None:
        raise InputError(f"cross-entropy '{step.result.name}' is differentiated only as the loss itself")
    if 1 in wanted:
        raise InputError(f"cross-entropy '{step.result.name}': its labels '{step.operands[1].name}' have no gradient")
    return {0: cross_entropy_grad(state.prog, step, state.seed, wanted[0])}


RULES = {"einsum": _einsum, "map": _map, "attention": _attention, "cross_entropy": _cross_entropy}
