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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
         dtype: str | None = None) -> dict[str, Blocked]:
    """Append the backward pass of `loss` to `prog`; the gradient of each `wrt` input, by name (module docstring)."""
    for x in wrt:
        if prog.inputs.get(x.name) is not x:
            raise InputError(f"grad: '{x.name}' is not an input of the program")
    state = Backward(prog, {x.name for x in wrt}, _needs(prog.tape, {x.name for x in wrt}), dtype)
    source = next((step for step in prog.tape if step.result is loss and step.kind != "output"), None)
    if source is None or loss.name not in state.needs:
        raise InputError(f"grad: '{loss.name}' does not depend on {', '.join(sorted(state.wrt)) or 'any input'}")
    _seed(state, source, seed)
    top = max(step.phase for step in prog.tape)
    for step in reversed(prog.tape):
        if step.kind in ("input", "output"):
            continue
        wanted = {k: f"d{k}.{step.result.name}" for k, x in enumerate(step.operands) if x.name in state.needs}
        prog.phase, prog.group = top + 1 + top - step.phase, 1
        dy = state.total(step.result)
        if (dy is None and step is not source) or not wanted:
            continue
        for k, g in RULES[step.kind](state, step, dy, wanted).items():
            x = step.operands[k]
            if state.acc(x) and g.dtype != state.acc(x):
                g = prog.map("cast", g, name=f"{wanted[k]}.{state.acc(x)}", dtype=state.acc(x))
            state.parts.setdefault(x.name, []).append(g)
    grads = {x.name: state.total(x) for x in wrt}
    for name, g in grads.items():
        if g is None:
            raise InputError(f"grad: '{loss.name}' does not depend on input '{name}'")
    return grads


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
