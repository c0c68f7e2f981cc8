"""Which kernel makes a float32 training step differ between the GPU and the cpu backend.

tests/test_cuda_train_gpu.py's float32 step (2 layers of its SMALL model, 512 tokens in blocks of 256,
rank 16) is evaluated vertex by vertex on the CPU with the numpy kernels; then every kernel vertex runs
alone on the GPU on the CPU's inputs (a one-vertex plan, `tests/test_cuda_train.run_kernel`), so each
error is that kernel's own, not one carried from upstream. Prints, per kernel name (and `wrt` for
attention_grad), the vertices run and the largest error relative to the largest |value| of the output,
worst first; with OUT set, writes them to $OUT/float32_localize.json. Also prints the whole step's
adapter-gradient errors (the GPU run of the planned step against the cpu backend's), as the test checks.

    python3 bench/investigations/float32_localize.py            # on a GPU
    python3 bench/investigations/float32_localize.py --per 2    # at most 2 vertices per kernel kind
"""
import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime.kernels_numpy import NUMPY_KERNELS  # noqa: E402
from turnip_ir.kernels import numpy_dtype  # noqa: E402


def evaluate_on_cpu(graph, inputs: dict) -> dict:
    """Every vertex's value, in topological (insertion) order, by the numpy kernels."""
    values = {}
    for node in graph.nodes.values():
        if node.op == "input":
            values[node.id] = np.asarray(inputs[node.id])
        elif node.op == "move":
            values[node.id] = values[node.inputs[0]].copy()
        else:
            out = np.full(node.shape, np.nan, dtype=numpy_dtype(node.dtype))
            NUMPY_KERNELS[node.op]([values[i] for i in node.inputs], out, node.attrs)
            values[node.id] = out
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, default=4, help="vertices per kernel kind run on the GPU")
    args = parser.parse_args()
    from tests.test_cuda_train import run_kernel, tiny_step
    from tests.test_cuda_train_gpu import SMALL

    step, inputs = tiny_step("float32", 2, 512, 256, 1.0, SMALL, 16)
    graph = step.graph
    values = evaluate_on_cpu(graph, inputs)
    worst: dict[str, list] = defaultdict(list)
    seen: dict[str, int] = defaultdict(int)
    nodes = graph.nodes.values()
    for node in nodes:
        if node.op in ("input", "move"):
            continue
        kind = node.op + (f"[{node.attrs['wrt']}]" if "wrt" in node.attrs else "")
        if seen[kind] >= args.per:
            continue
        seen[kind] += 1
        got = run_kernel(node.op, [values[i] for i in node.inputs], node.attrs).astype(np.float64)
        want = values[node.id].astype(np.float64)
        error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        worst[kind].append((error, node.id))
    rows = sorted(((max(e for e, _ in v), k, len(v), max(v)[1]) for k, v in worst.items()), reverse=True)
    print(f"{'kernel':28s} {'n':>3s} {'max rel error':>14s}  vertex")
    for error, kind, n, vertex in rows:
        print(f"{kind:28s} {n:3d} {error:14.2e}  {vertex}")

    from passes.insert_offload import minimum_budget
    from passes.pipeline import compile_taskgraph
    from runtime import execute
    from runtime.backends.cuda import CudaBackend

    memgraph = compile_taskgraph(graph, int(minimum_budget(graph) * 1.5))
    gpu = execute(memgraph, backend=CudaBackend(), order="nondet", inputs=inputs).outputs
    cpu = execute(memgraph, "cpu", inputs=inputs).outputs
    steps = {}
    for name, want in step.grads(cpu).items():
        got = step.grads(gpu)[name]
        steps[name] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    print("step: loss gpu", step.loss(gpu), "cpu", step.loss(cpu))
    for name, error in sorted(steps.items(), key=lambda kv: -kv[1])[:6]:
        print(f"step grad {name}: {error:.2e}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "float32_localize.json").write_text(json.dumps({"kernels": rows, "step": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
