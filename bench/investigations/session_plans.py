"""What a session's chosen prefill plans gain in the sim (issue 45), and what taking a choice made for
prompts alike gives up against a search of their own (docs/generation.md, "What a call does").

    python3 bench/investigations/session_plans.py                      # 7b at 4 GiB, the tables of docs/benchmarks.md
    python3 bench/investigations/session_plans.py --config tiny --memory 320KiB --shapes 4x64 --alike 4x40-64 --sets 1

Part 1: per B x P of --shapes, one `Session(backend="sim").generate` of B prompts of P tokens with
`prefill_plan="default"`, then with "auto" (an empty choice cache each): the sim's prefill seconds and the
choice. Part 2: per B x LO-HI of --alike, the choice for B prompts of HI tokens, then --sets random sets of
B lengths in [LO, HI] (numpy, --seed): each one's default plan, the choice taken (its block clamped as the
session clamps it) and a search of its own, by the sim's makespan. Prints two markdown tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from frontend.workloads import llama  # noqa: E402
from passes.pipeline import compile_taskgraph  # noqa: E402
from runtime import sim_makespan  # noqa: E402
from turnip import Session  # noqa: E402
from turnip.candidates import LlamaPrefill, PlanTarget  # noqa: E402
from turnip.choose import choose_llama_plan  # noqa: E402
from turnip.session import _alike  # noqa: E402
from turnip_ir.units import parse_size  # noqa: E402


def fresh_cache() -> None:
    os.environ["TURNIP_CACHE"] = tempfile.mkdtemp(prefix="turnip-choices-")


def chosen_against_default(config: str, memory: int, batch: int, tokens: int) -> dict:
    prompts = [np.zeros(tokens, dtype=np.int64)] * batch
    row = {}
    for plan in ("default", "auto"):
        fresh_cache()
        with Session(config, memory=memory, backend="sim", prefill_plan=plan) as session:
            result = session.generate(prompts, 1)
        row[plan] = result.prefill_seconds
        if result.prefill_plans:
            row["chosen"] = result.prefill_plans[0]
    return row


def packed(config: llama.LlamaConfig, lengths) -> LlamaPrefill:
    lengths = tuple(int(n) for n in lengths)
    return LlamaPrefill(config, sum(lengths), kv_outputs=True, sequences=lengths, hidden=False)


def makespan(prefill: LlamaPrefill, candidate, memory: int) -> float:
    return sim_makespan(compile_taskgraph(prefill.build(candidate).graph, memory, candidate.schedule))


def alike_rows(config: llama.LlamaConfig, memory: int, batch: int, low: int, high: int, sets: int, rng) -> list[dict]:
    fresh_cache()
    target = PlanTarget(memory, arena=memory)
    base = packed(config, [high] * batch)
    first = choose_llama_plan(base, target).candidate
    rows = []
    while len(rows) < sets:
        prefill = packed(config, rng.integers(low, high + 1, batch))
        if _alike(prefill) != _alike(base):  # another class: the session would search
            continue
        block = min(first.block, prefill.tokens)
        taken = replace(first, block=block, query_group=min(first.query_group, -(-prefill.tokens // block)))
        own = choose_llama_plan(prefill, target)
        rows.append({"tokens": prefill.tokens, "default": makespan(prefill, prefill.start({}), memory),
                     "taken": makespan(prefill, taken, memory), "own": own.makespan, "own_plan": own.candidate.describe()})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="7b")
    parser.add_argument("--memory", default="4GiB")
    parser.add_argument("--shapes", nargs="*", default=["16x2048", "64x512", "1x8192"], help="B x P")
    parser.add_argument("--alike", nargs="*", default=["16x1100-2047", "64x300-511"], help="B x LO-HI")
    parser.add_argument("--sets", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    memory = parse_size(args.memory)
    print(f"| B x P at {args.memory} | default plan (sim prefill) | chosen plan (sim prefill) | chosen |\n| --- | --- | --- | --- |")
    for shape in args.shapes:
        batch, tokens = map(int, shape.split("x"))
        began = time.perf_counter()
        row = chosen_against_default(args.config, memory, batch, tokens)
        chosen = row.get("chosen")
        print(f"| {shape} | {row['default']:.3f} s | {row['auto']:.3f} s ({row['auto'] / row['default']:.2f}x) | "
              f"{chosen.describe() if chosen else 'the defaults'} |  <!-- {time.perf_counter() - began:.1f} s -->", flush=True)
    config = llama.load_config(args.config)
    rng = np.random.default_rng(args.seed)
    print("\n| prompts | tokens | default plan | the choice taken (alike) | their own search |\n| --- | --- | --- | --- | --- |")
    for spec in args.alike:
        batch, span = spec.split("x")
        low, high = map(int, span.split("-"))
        for row in alike_rows(config, memory, int(batch), low, high, args.sets, rng):
            print(f"| {spec} | {row['tokens']} | {row['default']:.4f} s | {row['taken']:.4f} s ({row['taken'] / row['own']:.3f}x its own) | "
                  f"{row['own']:.4f} s: {row['own_plan']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
