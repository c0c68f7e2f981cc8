"""Regenerate the example taskgraphs in this folder: `python examples/make_examples.py`.

- blocked_matmul.json / .mlir: the seed's running example, a 256x256 matmul in 2x2 blocks over 3 GPUs,
  with GPU-to-GPU moves and a final sum per output block.
- ffn.json / .mlir: a small FFN stack (4 layers, 64 tokens, hidden 128, FFN 256) on one GPU.
- ffn_2gpu.json: the same stack split over 2 GPUs, with a move between the halves.
"""

from pathlib import Path

from turnip_ir.io import graph_text
from turnip_ir.models import blocked_matmul, ffn_stack

HERE = Path(__file__).parent


def main() -> None:
    graphs = {
        "blocked_matmul": blocked_matmul(n=256, blocks=2, devices=3),
        "ffn": ffn_stack(layers=4, tokens=64, hidden=128, ffn=256, devices=1),
        "ffn_2gpu": ffn_stack(layers=4, tokens=64, hidden=128, ffn=256, devices=2),
    }
    for name, graph in graphs.items():
        (HERE / f"{name}.json").write_text(graph_text(graph, "json"))
        if name != "ffn_2gpu":
            (HERE / f"{name}.mlir").write_text(graph_text(graph, "mlir"))
        print(f"wrote {name}: {len(graph)} nodes")


if __name__ == "__main__":
    main()
