"""One call to the GPU machine: prove the cuda backend correct there, then time it.

    source bench/gpu_setup.sh && python3 bench/gpu_check.py [--quick] [--no-tests] [--sections ...]

Writes under $OUT (or ./out): versions.txt, pytest.log, bench.log and cuda.json; prints a short summary
last, since the device tool returns only the tail of the output.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--sections", nargs="*", default=None)
    parser.add_argument("-k", default=None, help="pytest -k filter for the GPU tests")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    print(versions(out), flush=True)
    summary = "" if args.no_tests else tests(out, ["-k", args.k] if args.k else [])
    print(summary, flush=True)
    command = [sys.executable, "bench/bench_cuda.py", "--json", str(out / "cuda.json")]
    if args.quick:
        command.append("--quick")
    if args.sections is not None:
        command += args.sections
    with open(out / "bench.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            print(line, end="", flush=True)
        proc.wait()
    print("\n== GPU tests ==\n" + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
