"""The loss curve of docs/finetune.md: `python -m tools.finetune_curve [--steps 300] [--out docs/finetune-loss.png]`.

`turnip finetune` as a user runs it, on the cpu backend: the `tiny` preset (random weights from seed 0; a
vocabulary of 256, so a text's UTF-8 bytes are its tokens) learns the first 4 KiB of README.md as 64 rows
of 64 bytes, LoRA rank 8 on every projection, batch 4, lr 3e-3, under a budget of 256 KiB, which
offloads. Its --log CSV is written beside the picture and drawn (matplotlib, the bench extra); the first
and last losses are printed. Needs the training graph (`llama.build_training_step`).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np

from turnip_cli.main import main as turnip

ROOT = Path(__file__).resolve().parent.parent
TEXT_BYTES = 4096
ROW = 64


def run(steps: int, out: Path) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        text = (ROOT / "README.md").read_bytes()[:TEXT_BYTES]
        text = text[: len(text) // ROW * ROW]
        rows = np.frombuffer(text, np.uint8).astype(np.int64).reshape(-1, ROW)
        np.save(folder / "rows.npy", rows)
        code = turnip(["finetune", "--config", "tiny", "--data", str(folder / "rows.npy"), "--steps", str(steps), "--memory", "256KiB",
                       "--backend", "cpu", "--batch", "4", "--lr", "3e-3", "--lora-targets",
                       "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--adapter-out", str(folder / "adapter"),
                       "--log", str(out.with_suffix(".csv"))])
    if code != 0:
        sys.exit(code)
    return draw(out)


def draw(out: Path) -> list[float]:
    """The losses of the log beside `out`, drawn into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(out.with_suffix(".csv")) as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    figure, axes = plt.subplots(figsize=(6, 3.2), dpi=100)
    axes.plot(range(1, len(losses) + 1), losses, linewidth=1)
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats per token)")
    axes.set_title("turnip finetune: tiny preset, README.md bytes, LoRA r 8, cpu backend, 256 KiB", fontsize=9)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out)
    return losses


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "finetune-loss.png", help="the picture; its log is "
                        "written beside it (.csv)")
    parser.add_argument("--draw-only", action="store_true", help="draw the log that is there, without training")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse(None)
    losses = draw(args.out) if args.draw_only else run(args.steps, args.out)
    print(f"loss {losses[0]:.3f} at step 1, {losses[-1]:.3f} at step {len(losses)}; mean of the last 10 {np.mean(losses[-10:]):.3f}; "
          f"wrote {args.out}")
