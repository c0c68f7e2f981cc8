"""`turnip build`: write a workload's taskgraph (matmul, ffn, llama) as JSON or IR text.

Thin: `--config` is a preset, a JSON file or inline JSON (for llama: a preset, an HF `config.json` or
model folder); `--gpus`, `--block`, `--tokens` and `--placement` override the config's fields; llama
also takes `--layer-order` and `--query-group`, and any of its three `auto`s with `--memory`.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from turnip_cli.planning import (
    add_layer_order_arguments,
    add_remat_argument,
    block_argument,
    check_positive_options,
    choose_llama,
    parse_size,
)
from turnip.choose import LlamaPrefill, PlanTarget
from turnip_cli.progress import Progress, add_progress_argument
from turnip_ir.errors import InputError
from turnip_ir.files import atomic_write, check_outputs, is_file, is_folder
from turnip_ir.io import graph_text
from turnip_ir.taskgraph import TaskGraph
from frontend.workloads import ffn, llama, matmul
from frontend.workloads.common import config_from_text

WORKLOADS = {"matmul": (matmul, "seed"), "ffn": (ffn, "small"), "llama": (llama, "tiny")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", metavar="WORKLOAD", choices=WORKLOADS, help=", ".join(WORKLOADS))
    parser.add_argument("--config", help="preset name, JSON file or inline JSON (llama: preset, config.json or model folder)")
    parser.add_argument("--gpus", type=int, help="GPUs to place blocks on")
    parser.add_argument("--block", type=block_argument, help="block size: tokens per block (ffn, llama), tile edge (matmul); "
                        "llama clamps a block larger than --tokens to it; llama's auto keeps the block whose plan at "
                        "--memory the sim predicts fastest (as turnip llama --block auto)")
    parser.add_argument("--memory", metavar="SIZE", help="per-GPU budget --block auto compiles at (llama), e.g. 2GiB")
    parser.add_argument("--tokens", type=int, help="sequence length (ffn, llama)")
    placements = "; ".join(f"{name}: {', '.join(module.PLACEMENTS)}" for name, (module, _) in WORKLOADS.items())
    parser.add_argument("--placement", help=f"how blocks spread over GPUs ({placements})")
    parser.add_argument("-o", "--output", required=True, help="graph.json or graph.mlir")
    add_layer_order_arguments(parser, llama.LAYER_ORDERS)
    add_remat_argument(parser)
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not args.output.endswith((".json", ".mlir")):
        raise InputError(f"output '{args.output}' must end in .json or .mlir")
    check_positive_options(args, "gpus", "block", "tokens", "query_group")
    auto = "auto" in (args.block, args.layer_order, args.query_group)
    if auto != (args.memory is not None):
        raise InputError("--memory goes with --block, --layer-order or --query-group auto: the choice is made by compiling at the budget")
    if args.remat and not auto:
        raise InputError("--remat applies to the auto choices (the plans that choose them); turnip build writes no plan")
    config = args.config if args.config is not None and (is_file(args.config) or is_folder(args.config)) else None
    check_outputs({"-o": args.output}, {"--config": config})
    progress = Progress.for_args(args)
    with progress.phase("building the taskgraph"):
        graph = build_graph(args)
    with progress.phase(f"writing {args.output}"):
        atomic_write(args.output, graph_text(graph, "mlir" if args.output.endswith(".mlir") else "json"))
    kernels = sum(1 for node in graph.nodes.values() if node.op not in ("input", "move"))
    moves = sum(1 for node in graph.nodes.values() if node.op == "move")
    print(f"wrote {args.output}: {len(graph)} nodes ({kernels} kernels, {moves} moves) on {graph.devices} GPU(s)")
    return 0


def build_graph(args: argparse.Namespace) -> TaskGraph:
    if args.workload == "llama":
        name = args.config or "tiny"
        config = llama.load_config(name)
        tokens = args.tokens or llama.DEFAULT_TOKENS.get(name, min(config.max_position_embeddings, 4096))

        if args.memory is None:
            return llama.build_llama(config, tokens, args.block, args.gpus or 1, args.placement or "sequence",
                                     layer_order=args.layer_order, query_group=args.query_group).graph
        given = {"block": args.block, "layer_order": args.layer_order, "query_group": args.query_group, "schedule": "given"}
        prefill = LlamaPrefill(config, tokens, args.gpus or 1, args.placement or "sequence")
        return choose_llama(prefill, PlanTarget(parse_size(args.memory)), given, remat=args.remat).built.graph
    if args.block == "auto":  # a block size applies to every workload; choosing it, to llama alone
        raise InputError(f"--block auto applies to llama, not {args.workload}")
    for option, value, default in (("--layer-order", args.layer_order, "blocks"), ("--query-group", args.query_group, 1)):
        if value != default:
            raise InputError(f"{option} {value} applies to llama, not {args.workload}")
    if args.memory is not None:
        raise InputError(f"--memory applies to llama's auto choices, not {args.workload}")
    module, default = WORKLOADS[args.workload]
    config = config_from_text(type(module.PRESETS[default]), module.PRESETS, args.config, default)
    overrides = {"gpus": args.gpus, "block": args.block, "tokens": args.tokens, "placement": args.placement}
    if args.tokens is not None and args.workload == "matmul":
        raise InputError("--tokens applies to ffn and llama, not matmul")
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    return module.build(config).taskgraph()
