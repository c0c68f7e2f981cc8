"""One call to the GPU machine: prove the cuda backend correct there, then time it.

    source bench/gpu_setup.sh && python3 bench/gpu_check.py [--quick] [--no-tests] [--sections ...]

Writes under $OUT (or ./out): versions.txt, pytest.log, bench.log and cuda.json; prints a short summary
last, since the device tool returns only the tail of the output.

Section `memory` (run when named in --sections, or when --sections is not given; before bench_cuda.py's
sections): the budget is the process (issue 44). bench/bench_generation.py's budget stage samples, with
nvidia-smi, the device memory of `turnip generate` (7b, 16 x 2048, 32 new tokens) at 4 GiB and of
`turnip llama` (7b, 8192 tokens) at 2 GiB against the budget plus the CUDA context a probe process
measures; any peak above that, or a figure it could not measure, fails the check: FAILED lines and exit 1.
memory.json and memory.log hold the figures.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORY_TIMEOUT = 420
"""Seconds the memory section may take (about 90 on an H100: the probe, a 7b `turnip generate`, a `turnip llama`)."""


def versions(out: Path) -> str:
    code = (
        "import torch, cupy, numba, numpy, platform; from numba import cuda;"
        "import numba_cuda;"
        "print('python', platform.python_version(), 'torch', torch.__version__, 'cupy', cupy.__version__, 'numba', numba.__version__,"
        " 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__);"
        "print('gpu', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count(), 'driver', cupy.cuda.runtime.driverGetVersion())"
    )
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout + \
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.sm,clocks.max.sm", "--format=csv"], capture_output=True, text=True).stdout
    (out / "versions.txt").write_text(text)
    return text


def tests(out: Path, extra: list[str]) -> str:
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rfE", "--timeout", "240", *extra, "tests/test_cuda_gpu.py"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR")) or " passed" in line or " failed" in line]
    return "\n".join(lines[-15:]) + f"\n(tests: {time.perf_counter() - began:.0f} s)"


def memory(out: Path, options: list[str]) -> tuple[bool, str]:
    """The budget check (module docstring): whether every process kept within budget + context, and its table."""
    command = [sys.executable, "bench/bench_generation.py", "--stages", "budget", "--fail-over-budget", "--json", str(out / "memory.json"), *options]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=MEMORY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as err:
        (out / "memory.log").write_bytes((err.stdout or b"") + (err.stderr or b""))  # bytes, whatever text= says
        return False, f"MEMORY CHECK FAILED: bench_generation.py ran past {MEMORY_TIMEOUT} s"
    (out / "memory.log").write_text(proc.stdout + proc.stderr)
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    if proc.returncode == 0:
        return True, "\n".join(table)
    failed = [f"MEMORY CHECK FAILED: {line}" for line in table if line.rstrip().endswith("| NO |")]
    if not failed:  # the script itself failed: its last words
        failed = [f"MEMORY CHECK FAILED: exit {proc.returncode}: " + ((proc.stdout + proc.stderr).strip().splitlines() or [""])[-1][:300]]
    return False, "\n".join(table + failed)


def bench(out: Path, quick: bool, sections: list[str] | None) -> None:
    command = [sys.executable, "bench/bench_cuda.py", "--json", str(out / "cuda.json")]
    if quick:
        command.append("--quick")
    if sections is not None:
        command += sections
    with open(out / "bench.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            print(line, end="", flush=True)
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--sections", nargs="*", default=None, help="bench/bench_cuda.py's sections, and memory (default: all)")
    parser.add_argument("--memory-options", default="", help="more options for the memory section's bench_generation.py "
                        "(e.g. --memory-options=--quick on a CPU)")
    parser.add_argument("-k", default=None, help="pytest -k filter for the GPU tests")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    print(versions(out), flush=True)
    summary = "" if args.no_tests else tests(out, ["-k", args.k] if args.k else [])
    print(summary, flush=True)
    kept = None
    if args.sections is None or "memory" in args.sections:
        kept, table = memory(out, shlex.split(args.memory_options))
        print(f"== memory ==\n{table}", flush=True)
    sections = None if args.sections is None else [name for name in args.sections if name != "memory"]
    if sections is None or sections:
        bench(out, args.quick, sections)
    print("\n== GPU tests ==\n" + summary)
    if kept is not None:
        print("== memory ==\n" + (table if kept else "\n".join(line for line in table.splitlines() if line.startswith("MEMORY"))))
    return 0 if kept is not False else 1


if __name__ == "__main__":
    sys.exit(main())
