"""The plan `turnip llama` chooses by default (turnip/choose.py), on the sim backend: how near each tight
budget's plan comes to a loose budget's, and what choosing it costs on this machine.

    PYTHONPATH=. .venv/bin/python bench/bench_autoplan.py --points 32768:1GiB:8GiB 131072:2GiB:16GiB
    PYTHONPATH=. python3 bench/bench_autoplan.py --backend cuda --points 32768:1GiB:8GiB   # on the GPU host

Each point (tokens:tight:loose) runs `turnip llama --config 7b --tokens T --memory M --backend sim` (or cuda) in fresh
processes, each with an empty choice cache (TURNIP_CACHE) unless said: (1) the four dimensions forced to
the frontend's defaults at 7b (`--block 4096 --layer-order blocks --query-group 1 --schedule given`: no
search, what a run without flags did before the choice), (2) no flags (the search), (3) no flags again on (2)'s
cache (a second process: no search), (4) the loose budget with no flags. It prints a markdown table: the
plan chosen, the sims' makespans and their ratio, each process's wall seconds (start to exit, imports in)
and CPU seconds (its own and its children's: the search's forked compiles), the seconds the command says
the choosing took, and the load average when the point began (the machine is shared; wall seconds on a
loaded machine are not the code's). `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORCED = ["--block", "4096", "--layer-order", "blocks", "--query-group", "1", "--schedule", "given"]


def turnip_llama(config: str, tokens: int, memory: str, extra: list[str], cache: str, backend: str = "sim") -> dict:
    """One `turnip llama` process: its output's figures, wall and CPU seconds."""
    command = [sys.executable, "-m", "turnip_cli.main", "llama", "--config", config, "--tokens", str(tokens),
               "--memory", memory, "--backend", backend, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"TURNIP_CACHE": cache})
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    out = done.stdout
    chosen = re.search(r"^plan chosen in ([\d.]+) s: (.*?) \(sim", out, re.M)
    kept = re.search(r"^plan: (.*?) \(", out, re.M)
    return {"makespan": float(re.search(r"makespan ([\d.]+) ms", out).group(1)) / 1e3,
            "plan": chosen.group(2) if chosen else kept.group(1) if kept else "as forced",
            "choosing": float(chosen.group(1)) if chosen else None, "wall": wall,
            "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), "output": out}


def point(config: str, tokens: int, tight: str, loose: str, backend: str = "sim") -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as other:
        forced = turnip_llama(config, tokens, tight, FORCED, first, backend)
        chosen = turnip_llama(config, tokens, tight, [], first, backend)
        again = turnip_llama(config, tokens, tight, [], first, backend)
        loose_run = turnip_llama(config, tokens, loose, [], other, backend)
    return {"tokens": tokens, "tight": tight, "loose": loose, "load": load, "forced": forced, "chosen": chosen,
            "again": again, "loose_run": loose_run}


def row(found: dict) -> str:
    forced, chosen, again, loose = (found[k] for k in ("forced", "chosen", "again", "loose_run"))
    ratio = chosen["makespan"] / loose["makespan"]
    choosing = f"{chosen['choosing']:.1f}" if chosen["choosing"] is not None else "-"
    tokens = found["tokens"]
    label = f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
    return (f"| {label} at {found['tight']} / {found['loose']} | {chosen['plan']} | "
            f"{chosen['makespan']:.3f} (forced defaults {forced['makespan']:.3f}) | {loose['makespan']:.3f} | **{ratio:.3f}** "
            f"(defaults {forced['makespan'] / loose['makespan']:.3f}) | {forced['wall']:.1f} / {chosen['wall']:.1f} / "
            f"{again['wall']:.1f} | {forced['cpu']:.1f} / {chosen['cpu']:.1f} / {again['cpu']:.1f} | {choosing} | {found['load']:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="+", default=["32768:1GiB:8GiB", "131072:2GiB:16GiB"], help="TOKENS:TIGHT:LOOSE")
    parser.add_argument("--config", default="7b", help="the llama preset (tiny: the test's)")
    parser.add_argument("--backend", default="sim", choices=("sim", "cuda"), help="cuda: the GPU host's figures (measured makespans)")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    print("| point | plan chosen | sim tight (s) | sim loose (s) | tight / loose | wall s: forced / chosen / again | "
          "CPU s: forced / chosen / again | choosing (s) | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for text in args.points:
        tokens, tight, loose = text.split(":")
        found = point(args.config, int(tokens), tight, loose, args.backend)
        rows.append(found)
        print(row(found), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
