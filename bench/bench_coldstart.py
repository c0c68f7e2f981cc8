"""Cold start: `turnip llama` from a safetensors folder, end to end, against a hand-written torch script.

    python3 bench/bench_coldstart.py --json out/coldstart.json          # 7b fp16, 8192 tokens, 2 GiB (the H200)
    python3 bench/bench_coldstart.py --config tiny --tokens 64 --memory 1MiB --backend cpu --json /tmp/cold.json  # CPU

Steps, each timed: write a model folder of random fp16 weights with our safetensors writer (`config.json`,
one shard per layer and one for the embedding and norm, and the index; 13 GB for 7b) in a temporary
folder (`--folder` to keep it); read every file once so the page cache is warm; time `cp FILE /dev/null`
over the files (the rate a load from the page cache is held against); then, each as a fresh process:
(a) `turnip llama --weights DIR --input-ids ids.npy --memory M`, twice (the cuda kernels' on-disk cache is
cleared first, so the first process compiles them and the second loads them), its phases read from its summary line; (b) a hand-written torch script
(this file with `--torch-child`; its load phase includes pinning) that reads the same files through our reader into pinned host tensors
(threads, one copy each) and runs bench/run.py's torch-prefetch prefill (layer i+1 copied on a side
stream while layer i computes; on a CPU, `--device cpu`, the same layers resident). Each process's
wall time and peak resident memory (wait4) are recorded; "start" is turnip's time before its first
phase (the interpreter and its imports). Prints a table; `--json` keeps every figure.
Where torch (or CUDA) is missing the torch row says why and the turnip rows still run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frontend.safetensors import INDEX_FILE, SafeTensors, save_file  # noqa: E402
from frontend.workloads import llama  # noqa: E402
from frontend.workloads.llama.config import PRESETS  # noqa: E402
from turnip_ir.files import atomic_write  # noqa: E402
from turnip_ir.units import format_size  # noqa: E402

LAYER_WEIGHTS = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
"""One layer's weights in the order bench/run.py's torch layer takes them."""
PHASES = re.compile(r"^phases: load (?P<load>[\d.]+) s \(model (?P<model>[\d.]+) s, weights into host memory (?P<weights>[\d.]+) s\), "
                    r"compile (?P<compile>[\d.]+) s, prepare (?P<prepare>[\d.]+) s, run (?P<run>[\d.]+) s; (?P<wall>[\d.]+) s end to end$", re.M)


# ----- the model folder ------------------------------------------------------------------------------------------
def hf_config(name: str) -> dict:
    """The HF config.json document of a preset or a JSON file, in float16."""
    doc = dict(PRESETS[name]) if name in PRESETS else json.loads(Path(name).read_text())
    doc.pop("dtype", None)
    return {"model_type": "llama", **doc, "torch_dtype": "float16"}


def write_model(folder: Path, config_name: str, seed: int) -> tuple[llama.LlamaConfig, list[Path], int]:
    """config.json and the weights as shards (one per layer): the config, the shard files and the data bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "config.json", json.dumps(hf_config(config_name), indent=2))
    config = llama.load_config(str(folder))
    weights = llama.RandomWeights(config, seed)
    groups = [[n for n in weights if n.startswith(f"model.layers.{i}.")] for i in range(config.num_hidden_layers)]
    groups.append([n for n in weights if not n.startswith("model.layers.")])
    weight_map, files, total = {}, [], 0
    for i, names in enumerate(groups):
        file_name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        total += save_file({n: weights[n] for n in names}, folder / file_name)  # one shard in memory at a time
        weight_map.update({n: file_name for n in names})
        files.append(folder / file_name)
    atomic_write(folder / INDEX_FILE, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return config, files, total


def copy_rate(files: list[Path]) -> dict:
    """Warm the page cache (read every file once), then time `cp FILE /dev/null` over all of them."""
    for path in files:
        with open(path, "rb") as handle:
            while handle.read(64 << 20):
                pass
    began = time.perf_counter()
    for path in files:
        subprocess.run(["cp", str(path), "/dev/null"], check=True)
    seconds = time.perf_counter() - began
    size = sum(path.stat().st_size for path in files)
    return {"bytes": size, "seconds": seconds, "rate": size / seconds}


# ----- the processes ---------------------------------------------------------------------------------------------
def timed_process(command: list[str], timeout: float) -> dict:
    """Run `command` from the repository root; its wall seconds, peak resident bytes, exit code and output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        try:
            _, status, usage = _wait4(process, timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return {"error": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - began
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    code = os.waitstatus_to_exitcode(status)
    result = {"wall_s": wall, "peak_rss": usage.ru_maxrss * 1024, "returncode": code, "stdout": stdout}
    if code != 0:
        result["error"] = (stderr.strip().splitlines() or [f"exit {code}"])[-1][:300]
    return result


def _wait4(process: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return pid, status, usage
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        time.sleep(0.02)


def run_turnip(folder: Path, ids: Path, memory: str, backend: str, timeout: float, plan_dir: Path | None = None) -> dict:
    command = [sys.executable, "-m", "turnip_cli.main", "llama", "--weights", str(folder), "--input-ids", str(ids),
               "--memory", memory, "--backend", backend, *(["--plan-dir", str(plan_dir)] if plan_dir else [])]
    result = timed_process(command, timeout)
    stdout = result.pop("stdout", "")
    result["cuda_lines"] = [line for line in stdout.splitlines() if line.startswith("cuda:")]
    result["plan_lines"] = [line for line in stdout.splitlines() if line.startswith(("plan", "block", "layer order", "attention"))]
    found = PHASES.search(stdout)
    if found:
        result["phases"] = {key: float(value) for key, value in found.groupdict().items()}
    elif "error" not in result:
        result["error"] = "no phases line in turnip's output"
    return result


def clear_kernel_cache() -> int:
    """Remove the cuda kernels' on-disk cache (runtime/backends/cuda/compat.py, `cached_kernel`) where
    numba keeps it beside the sources, so the first process compiles them and the second loads them; the
    number of files removed."""
    removed = 0
    for path in (ROOT / "runtime" / "backends" / "cuda" / "__pycache__").glob("kernels_numba.*.nb[ci]"):
        path.unlink()
        removed += 1
    return removed


def run_torch(folder: Path, ids: Path, device: str, timeout: float) -> dict:
    result = timed_process([sys.executable, str(Path(__file__).resolve()), "--torch-child", str(folder), str(ids), device], timeout)
    lines = result.pop("stdout", "").strip().splitlines()
    if "error" not in result:
        result.update(json.loads(lines[-1]))
    return result


# ----- the torch script (a child process) --------------------------------------------------------------------------
def torch_child(folder: str, ids_path: str, device: str) -> None:
    """Read the folder's weights into pinned host tensors (our reader, threads), run the prefetch prefill, print JSON."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "bench"))
    import run as bench_run  # the torch-prefetch baseline's layer math and prefetcher, reused as they are
    from frontend.workloads.llama.rope import rope_tables

    began = time.perf_counter()
    config = llama.load_config(folder)
    file = SafeTensors.open(folder)
    pin = device == "cuda"
    names = [[f"model.layers.{i}.{n}.weight" for n in LAYER_WEIGHTS] for i in range(config.num_hidden_layers)]
    host = {name: torch.empty(file.shape(name), dtype=torch.float16, pin_memory=pin) for layer in names for name in layer}
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda name: file.read_into(name, host[name].numpy()), host))
    loaded = time.perf_counter()
    ids = np.load(ids_path).reshape(-1)
    hidden = np.ascontiguousarray(file.get("model.embed_tokens.weight", "float16")[ids])
    cos, sin = (torch.from_numpy(t.astype(np.float16)).to(device) for t in rope_tables(config, len(ids)))
    norm = torch.from_numpy(file.get("model.norm.weight", "float16")).to(device)
    x0 = torch.from_numpy(hidden).to(device)
    layers = [[host[name] for name in layer] for layer in names]
    args = (norm, cos, sin, config.num_attention_heads, config.head_dim, config.rms_norm_eps, F)
    if device == "cuda":
        forward = bench_run._prefetcher(x0, layers, *args)
    else:  # no streams on a CPU: the same layer math, every weight where it is
        forward = lambda: bench_run._llama_forward(x0, layers, *args)  # noqa: E731
    out = forward()
    if device == "cuda":
        torch.cuda.synchronize()
    finished = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    print(json.dumps({"load_s": loaded - began, "run_s": finished - loaded, "gpu_peak": peak,
                      "finite": bool(torch.isfinite(out.float()).all())}))


# ----- the report -------------------------------------------------------------------------------------------------
def table(report: dict) -> list[str]:
    copy = report["cp"]
    lines = [f"cp of {format_size(copy['bytes'])} from the page cache to /dev/null: {copy['rate'] / 1e9:.2f} GB/s; "
             f"the layers' weights {format_size(report['weight_bytes'])}",
             "| process | end to end s | start s | load s | weights s (GB/s, x cp) | compile s | prepare s | run s | peak RSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    weights = report["weight_bytes"]
    for name, result in report["runs"].items():
        if "error" in result:
            lines.append(f"| {name} | {result['error']} |")
            continue
        phases = result.get("phases")
        if phases:
            rate = weights / phases["weights"] if phases["weights"] else float("inf")
            start = phases["wall"] - sum(phases[key] for key in ("load", "compile", "prepare", "run"))
            cells = [f"{start:.2f}", f"{phases['load']:.2f}", f"{phases['weights']:.2f} ({rate / 1e9:.1f}, {rate / copy['rate']:.2f}x)",
                     f"{phases['compile']:.2f}", f"{phases['prepare']:.2f}", f"{phases['run']:.2f}"]
        else:
            rate = weights / result["load_s"] if result["load_s"] else float("inf")
            cells = ["-", f"{result['load_s']:.2f}", f"{result['load_s']:.2f} ({rate / 1e9:.1f}, {rate / copy['rate']:.2f}x)", "-", "-",
                     f"{result['run_s']:.2f}"]
        lines.append(f"| {name} | {result['wall_s']:.2f} | " + " | ".join(cells) + f" | {format_size(result['peak_rss'])} |")
    for name, result in report["runs"].items():
        lines += [f"{name}: {line}" for line in result.get("cuda_lines", [])]
    ratio = report.get("turnip_over_torch")
    if ratio is not None:
        lines.append(f"turnip (second process) / torch end to end: {ratio:.2f}x")
    return lines


def measure(args: argparse.Namespace, folder: Path) -> dict:
    began = time.perf_counter()
    config, files, total = write_model(folder, args.config, args.seed)
    written = time.perf_counter() - began
    ids = folder / "ids.npy"
    np.save(ids, llama.random_ids(config, args.tokens, args.seed))
    layer_bytes = sum(f.stat().st_size for f in files[:-1])
    report = {"config": args.config, "tokens": args.tokens, "memory": args.memory, "backend": args.backend,
              "weight_bytes": layer_bytes, "model_bytes": total, "write_s": written, "cp": copy_rate(files), "runs": {}}
    report["kernel_cache_cleared"] = clear_kernel_cache()
    for attempt in ("turnip (first process)", "turnip (second process)"):
        report["runs"][attempt] = run_turnip(folder, ids, args.memory, args.backend, args.timeout)
    if args.plan_dir:  # issue 45's target: a second cold process that reads its plan (and choice) from --plan-dir
        plans = Path(args.plan_dir)
        shutil.rmtree(plans, ignore_errors=True)
        for attempt in ("turnip --plan-dir (fills it)", "turnip --plan-dir (reads it)"):
            report["runs"][attempt] = run_turnip(folder, ids, args.memory, args.backend, args.timeout, plans)
    report["runs"]["torch"] = _torch_or_why(folder, ids, args)
    turnip, torch_run = report["runs"]["turnip (second process)"], report["runs"]["torch"]
    if "error" not in turnip and "error" not in torch_run:
        report["turnip_over_torch"] = turnip["wall_s"] / torch_run["wall_s"]
    return report


def _torch_or_why(folder: Path, ids: Path, args: argparse.Namespace) -> dict:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True)
    if probe.returncode != 0:
        return {"error": "skipped: torch is not importable"}
    device = args.torch_device or ("cuda" if probe.stdout.strip() == "True" else "cpu")
    return {**run_torch(folder, ids, device, args.timeout), "device": device}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b", help="preset or HF config.json (written in float16)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--memory", default="2GiB", help="turnip's per-GPU budget")
    parser.add_argument("--backend", default="auto", help="turnip's backend (auto: cuda when a GPU is there)")
    parser.add_argument("--torch-device", choices=("cuda", "cpu"), help="default: cuda when torch sees one, else cpu")
    parser.add_argument("--folder", help="write the model here and keep it (default: a temporary folder, removed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240, help="seconds each process may take")
    parser.add_argument("--plan-dir", metavar="DIR", help="also run turnip twice with --plan-dir DIR (emptied first): the second reads its plan")
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--torch-child", nargs=3, metavar=("FOLDER", "IDS", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_child:
        torch_child(*args.torch_child)
        return 0
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="turnip-coldstart-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stage's `timeout` still removes the 13 GB folder
    try:
        report = measure(args, folder)
    finally:
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(table(report)))
    if args.json:
        atomic_write(Path(args.json), json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
