"""Regenerate the example taskgraphs in this folder: `python examples/make_examples.py`.

- blocked_matmul.json / .mlir: the seed's running example, a 256x256 matmul in 128x128 tiles over 3 GPUs,
  with GPU-to-GPU moves and a final sum per output block (`turnip build matmul`).
- ffn.json / .mlir: 4 layers of gelu(x W1^T) W2^T, 64 tokens in one block, hidden 128, FFN 256, on one GPU.
- ffn_2gpu.json: the same stack as a 2-stage pipeline over 2 GPUs, with a move between the halves.
- llama_tiny.json: the tiny LLaMA prefill (2 layers, hidden 64, 4 heads, 128 tokens in 4 blocks)
  (`turnip build llama --config tiny`).
"""

from pathlib import Path

from turnip_ir.files import atomic_write
from turnip_ir.io import graph_text
from frontend.workloads import ffn, llama, matmul

HERE = Path(__file__).parent


def texts() -> dict[str, str]:
    """File name -> the text this script writes there (tests/test_examples.py checks the files match)."""
    stack = ffn.FfnConfig(layers=4, tokens=64, hidden=128, ffn=256, block=64)
    graphs = {
        "blocked_matmul": matmul.build(matmul.PRESETS["seed"]).taskgraph(),
        "ffn": ffn.build(stack).taskgraph(),
        "ffn_2gpu": ffn.build(ffn.FfnConfig(**{**stack.__dict__, "gpus": 2, "placement": "layers"})).taskgraph(),
        "llama_tiny": llama.build_llama(llama.load_config("tiny"), 128).graph,
    }
    out = {}
    for name, graph in graphs.items():
        out[f"{name}.json"] = graph_text(graph, "json")
        if name in ("blocked_matmul", "ffn"):
            out[f"{name}.mlir"] = graph_text(graph, "mlir")
    return out


def main() -> None:
    for name, text in texts().items():
        atomic_write(HERE / name, text)
        print(f"wrote {name}")

if __name__ == "__main__":
    main()
