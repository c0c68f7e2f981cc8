"""The cpu backend against transformers on the CPU: one LLaMA prefill, the same weights, tokens and threads.

Run: .venv/bin/python bench/bench_cpu.py [--config JSON] [--tokens 2048] [--memory 4GiB] [--threads N] [--repeat 3]
     .venv/bin/python bench/bench_cpu.py --quick      # a tiny model in a few seconds (tests/test_bench_cpu.py)

The model is an 8-layer LLaMA of hidden size 1024 (`MODEL`, or an HF config.json / the same keys given
with `--config`) with random weights (`RandomWeights`, seed 0, materialised once) and random token ids.
turnip runs `turnip llama`'s library path: `build_llama` (its default block), `compile_taskgraph` at
`--memory`, then `execute` on one prepared cpu backend, `--repeat` times; transformers runs `LlamaModel`
(torch on the CPU) on the same weights and ids, `--repeat` times. Both get `--threads` (default: the cores
this process may use): torch through `torch.set_num_threads`, turnip as its cpu backend's `threads`.
Each run is timed in wall seconds (a turnip run: `execute`, the inputs copied into its buffers and the
outputs read back included), the two alternated so that both see the same load on a shared machine (the
table gives the load average before and after); the table gives the median and the spread (min-max), and
the ratio of the medians. The hidden states of the two must agree (max abs difference over max |h|
within `TOLERANCE` for the dtype), else the script exits 1. The time per kernel of turnip's last run
(busy seconds summed over its lanes) shows where it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frontend.workloads import llama  # noqa: E402
from frontend.workloads.llama.config import from_hf  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import arena_budget, execute  # noqa: E402
from runtime.backends.cpu import CpuBackend  # noqa: E402
from turnip_ir.pools import cores  # noqa: E402
from turnip_cli.planning import parse_size  # noqa: E402

MODEL = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
         "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000, "rms_norm_eps": 1e-5,
         "max_position_embeddings": 4096, "rope_theta": 10000.0, "torch_dtype": "float32"}
"""The default model: 8 layers of 7B's shape scaled to hidden 1024 (16 heads of 64)."""
QUICK = {**MODEL, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512}
"""`--quick`: two small layers with grouped queries, 64 tokens."""
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}
"""Largest |turnip - transformers| over max |transformers| accepted, per dtype."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", metavar="JSON", help="an HF config.json or the same keys (default: the 8-layer hidden-1024 model)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--memory", default="4GiB", help="turnip's per-GPU budget (default 4GiB: the plan offloads nothing)")
    parser.add_argument("--threads", type=int, default=cores(), help="threads for both (default: this process's cores)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float16"), help="compute dtype (default: the config's)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 64 tokens, one run each")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeat = 64, 1
    return args


def model_config(args: argparse.Namespace) -> dict:
    doc = QUICK if args.quick else MODEL if args.config is None else json.loads(Path(args.config).read_text())
    return {**doc, "torch_dtype": args.dtype} if args.dtype else doc


class TurnipPrefill:
    """`turnip llama`'s library path: the blocked prefill built and compiled once, then run on one
    prepared cpu backend (`run`: inputs copied in, the run, outputs read back)."""

    def __init__(self, config, weights, ids, budget: int, threads: int):
        self.built = llama.build_llama(config, len(ids))
        began = time.perf_counter()
        self.memgraph = compile_taskgraph(self.built.graph, arena_budget(self.built.graph, budget, "cpu"))
        self.compile_seconds = time.perf_counter() - began
        self.inputs = self.built.feed(weights, ids)
        self.backend = CpuBackend(threads=threads)
        self.result = None

    def run(self) -> np.ndarray:
        self.result = execute(self.memgraph, backend=self.backend, inputs=self.inputs, verify=False, close=False)
        return self.built.gather(self.result.outputs)

    def close(self) -> None:
        self.backend.close()

    def kernel_seconds(self) -> dict[str, float]:
        """Busy seconds per kernel (copies under their op) in the last run, largest first."""
        busy: dict[str, float] = defaultdict(float)
        recorder = self.result.recorder
        for done in recorder.completions:
            node = recorder.graph.node(done.vertex)
            busy[node.kernel or node.op] += done.end - done.start
        return dict(sorted(busy.items(), key=lambda item: -item[1]))


class TorchPrefill:
    """transformers' `LlamaModel` on the same weights: `run` is one forward, the hidden states [T, hidden]."""

    def __init__(self, doc: dict, weights, ids, threads: int, dtype: str):
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = transformers.LlamaModel(transformers.LlamaConfig(**doc)).to(getattr(torch, dtype)).eval()
        state = {name.removeprefix("model."): torch.from_numpy(np.asarray(weights[name])) for name in weights if name != "lm_head.weight"}
        self.model.load_state_dict(state)
        self.ids = torch.from_numpy(ids)[None]

    def run(self) -> np.ndarray:
        with self.torch.no_grad():
            return self.model(input_ids=self.ids).last_hidden_state[0].float().numpy()


def timed(run) -> tuple[float, np.ndarray]:
    began = time.perf_counter()
    hidden = run()
    return time.perf_counter() - began, hidden


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    doc = model_config(args)
    config = from_hf(doc, args.config or ("quick" if args.quick else "bench_cpu"))
    ids = llama.random_ids(config, args.tokens, 0)
    random = llama.RandomWeights(config, seed=0)
    weights = {name: random[name] for name in random}  # drawn once, outside both timings
    turnip = TurnipPrefill(config, weights, ids, parse_size(args.memory), args.threads)
    reference = TorchPrefill(doc, weights, ids, args.threads, config.dtype)
    load = os.getloadavg()[0]
    turnip_spans, torch_spans = [], []
    try:
        for _ in range(args.repeat):  # alternated, so that both see the same load on a shared machine
            span, ours = timed(turnip.run)
            turnip_spans.append(span)
            span, theirs = timed(reference.run)
            torch_spans.append(span)
    finally:
        turnip.close()
    error = float(np.abs(ours.astype(np.float64) - theirs).max() / np.abs(theirs).max())
    ratio = statistics.median(turnip_spans) / statistics.median(torch_spans)
    shape = f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.dtype}, {args.tokens} tokens"
    print("| model | threads | load average | turnip (cpu backend) s, median (min-max) | transformers s, median (min-max) "
          "| turnip / transformers | max error / max abs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {shape} | {args.threads} | {load:.1f}-{os.getloadavg()[0]:.1f} | {spread(turnip_spans)} | {spread(torch_spans)} "
          f"| {ratio:.2f} | {error:.1e} |")
    print()
    print("| turnip kernel | busy s (last run, all lanes) |")
    print("| --- | --- |")
    for kernel, seconds in list(turnip.kernel_seconds().items())[:8]:
        print(f"| {kernel} | {seconds:.3f} |")
    print(f"\ncompile {turnip.compile_seconds:.2f} s (not in the runs)")
    if error > TOLERANCE[config.dtype]:
        print(f"bench_cpu: turnip and transformers disagree: max error {error:.2e} of max |h| (tolerance {TOLERANCE[config.dtype]:.0e})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
