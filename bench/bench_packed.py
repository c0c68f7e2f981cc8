"""A batch of prompts through one packed prefill, in the sim, against one prefill of as many tokens (issue 44).

    .venv/bin/python bench/bench_packed.py                  # 7b at 4 GiB: 16 x 512 and 3000 + 2000 + 2000 + 1192
    .venv/bin/python bench/bench_packed.py --memory 2GiB --block 8192 --json packed.json
    .venv/bin/python bench/bench_packed.py --quick          # the tiny preset in seconds (tests/test_packed_prefill.py)

Each batch is built once with `build_llama(sequences=)` (the prompts packed end to end, blocks cut by
`partition.split_packed`), compiled at `--memory` as `turnip llama --backend sim` compiles (the default
pipeline, inputs on the GPU while they fit) and run by the sim (nondet, the H200 cost model at
torch-cudnn's rates). It is set against:
  one prefill      `build_llama` over the batch's total tokens (`turnip llama --tokens T`), the issue's
                   reference: the targets are packed / one prefill, 1.15x for 16 x 512, 1.20x ragged;
  prompt by prompt each prompt's own prefill, one after another (what turnip/session.py ran before);
The makespans leave out the copies a plan makes before its run (the inputs it starts on the GPU while they
fit, as `turnip llama` reports it); the last column adds them, once for a packed plan, once per prompt for
prompt by prompt. Each is run twice: plain (`turnip llama` has no other outputs) and with every layer's k and v as
outputs (`kv_outputs`, what a session's prefill must write out for the decode; the one prefill likewise).
`--block` sets the token block of every graph (default: `default_block`, 4096 at 7b). Prints one markdown
table; `--json` keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_llama import sizes  # noqa: E402
from frontend.workloads import llama  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import execute  # noqa: E402
from turnip_ir.cost import CostModel  # noqa: E402
from turnip_cli.planning import parse_size  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402

BATCHES = {"16 x 512": ([512] * 16, 1.15), "3000 + 2000 + 2000 + 1192": ([3000, 2000, 2000, 1192], 1.20)}
"""The issue's batches: name -> (prompt lengths, target of packed / one prefill)."""
QUICK = {"8 x 8": ([8] * 8, 1.15), "24 + 16 + 16 + 8": ([24, 16, 16, 8], 1.20)}


def predict(config: llama.LlamaConfig, lengths: list[int] | None, tokens: int, budget: int, kv: bool, block: int | None) -> dict:
    """The sim's makespan of one prefill (packed when `lengths`) compiled at `budget`, with its graph's sizes."""
    built = llama.build_llama(config, tokens, block, kv_outputs=kv, sequences=lengths)
    began = time.perf_counter()
    memgraph = compile_taskgraph(built.graph, budget)
    compiled = time.perf_counter() - began
    kernels, attention, flops, _, _, _ = sizes(built.graph)
    summary = execute(memgraph, backend="sim", order="nondet", verify=False).summary
    return {"seconds": summary.makespan, "placed_s": summary.bytes_placed / CostModel().h2d_bw,
            "blocks": len(built.program.inputs["hidden"].splits[0]), "kernels": kernels,
            "attention": attention, "tflop": flops / 1e12, "reloaded": sum(n.nbytes for n in memgraph.nodes if n.op == "reload"),
            "offloaded": sum(n.nbytes for n in memgraph.nodes if n.op == "offload"), "compile_s": compiled}


def one_by_one(config: llama.LlamaConfig, lengths: list[int], budget: int, kv: bool, block: int | None) -> tuple[float, float]:
    """The sim's makespans of each prompt's own prefill, added (a length's plan is predicted once); and the
    same with the copies each plan makes before its run (the inputs it starts on the GPU)."""
    alone = {n: predict(config, None, n, budget, kv, block) for n in set(lengths)}
    return sum(alone[n]["seconds"] for n in lengths), sum(alone[n]["seconds"] + alone[n]["placed_s"] for n in lengths)


def rows(config: llama.LlamaConfig, batches: dict, budget: int, block: int | None = None) -> list[dict]:
    results = []
    for kv in (False, True):
        reference = {}
        for name, (lengths, target) in batches.items():
            tokens = sum(lengths)
            if tokens not in reference:
                reference[tokens] = predict(config, None, tokens, budget, kv, block)
            packed = predict(config, lengths, tokens, budget, kv, block)
            alone, placing = one_by_one(config, lengths, budget, kv, block)
            results.append({"batch": name, "lengths": lengths, "kv_outputs": kv, "target": target, "packed": packed,
                            "one_prefill": reference[tokens], "prompt_by_prompt_s": alone, "prompt_by_prompt_placing_s": placing})
    plain = {row["batch"]: row["one_prefill"]["seconds"] for row in results if not row["kv_outputs"]}
    for row in results:  # the targets are against `turnip llama`, which writes no k or v
        row["ratio"] = row["packed"]["seconds"] / plain[row["batch"]]
        row["ratio_same_outputs"] = row["packed"]["seconds"] / row["one_prefill"]["seconds"]
        row["met"] = row["ratio"] <= row["target"]
    return results


def table(results: list[dict]) -> str:
    lines = ["| batch | k/v outputs | blocks | attention tasks | TFLOP | packed (sim) | one prefill (sim) | prompt by prompt (sim) "
             "| packed / turnip llama | target | packed / one prefill with the same outputs | packed, prompt by prompt with the copies "
             "before each run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in results:
        packed = row["packed"]
        lines.append(f"| {row['batch']} | {'yes' if row['kv_outputs'] else 'no'} | {packed['blocks']} | {packed['attention']:,} "
                     f"| {packed['tflop']:.1f} | {_ms(packed['seconds'])} | {_ms(row['one_prefill']['seconds'])} "
                     f"| {_ms(row['prompt_by_prompt_s'])} | {row['ratio']:.3f}x | {row['target']:.2f}x {'met' if row['met'] else 'MISSED'} "
                     f"| {row['ratio_same_outputs']:.3f}x | {_ms(packed['seconds'] + packed['placed_s'])}, "
                     f"{_ms(row['prompt_by_prompt_placing_s'])} |")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="preset or config.json (default 7b; tiny with --quick)")
    parser.add_argument("--memory", default=None, help="per-GPU budget (default 4GiB; 128KiB with --quick)")
    parser.add_argument("--block", type=int, help="tokens per block of every graph (default: build_llama's)")
    parser.add_argument("--quick", action="store_true", help="the tiny preset's small batches, in seconds")
    parser.add_argument("--json", metavar="OUT.json", help="write every figure here")
    args = parser.parse_args(argv)
    config = llama.load_config(args.config or ("tiny" if args.quick else "7b"))
    budget = parse_size(args.memory or ("128KiB" if args.quick else "4GiB"))
    results = rows(config, QUICK if args.quick else BATCHES, budget, args.block)
    blocks = f"blocks of {args.block}" if args.block else "default blocks"
    print(f"{config.name} at {args.memory or ('128KiB' if args.quick else '4GiB')} per GPU, {blocks}, sim makespans (nondet):\n")
    print(table(results))
    if args.json:
        atomic_write(Path(args.json), json.dumps({"config": config.name, "budget": budget, "block": args.block, "rows": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
