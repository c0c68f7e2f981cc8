"""Which step of a 2-GPU process makes it abort at interpreter exit ("double free or corruption")?

    source bench/gpu_setup.sh && python3 bench/investigations/exit_check.py [--json out.json]     # on nvidia-h200-x2

Every process that ran turnip over both GPUs of the 2-GPU machine printed its results and then died in
glibc's heap check at exit. Each scenario below is a fresh interpreter that does one more of the things
the cuda backend does over two GPUs (contexts, peer access, a peer copy, portable pinned memory, CuPy's
cuBLAS handles and streams, cuda.core streams, torch, the host-function notifier, a whole run), with
faulthandler on, so the first scenario that aborts names the step, and the Python frames printed at the
abort name the finalizer. The last scenarios try remedies on a whole run: the backend's `close` with and
without its release of every CUDA object (`CudaBackend(release_at_close=False)`), then explicit teardowns at exit. Prints a table (scenario, exit status, the last
stderr line) and, with --json, every scenario's stderr tail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TWO_CONTEXTS = """
import numpy as np
from numba import cuda
from runtime.backends.cuda.compat import stream_handle
arrays, streams = [], []
for d in (0, 1):
    with cuda.gpus[d]:
        arrays.append(cuda.device_array(1 << 20, dtype=np.uint8))
        streams.append(cuda.stream())
"""
PEERS = TWO_CONTEXTS + """
from numba.cuda.cudadrv.driver import driver
contexts = []
for d in (0, 1):
    with cuda.gpus[d]:
        contexts.append(cuda.current_context())
for a in (0, 1):
    with cuda.gpus[a]:
        driver.cuCtxEnablePeerAccess(contexts[1 - a].handle, 0)
"""
PEER_COPY = PEERS + """
with cuda.gpus[1]:
    ptr = lambda x: x.__cuda_array_interface__["data"][0]
    driver.cuMemcpyAsync(ptr(arrays[1]), ptr(arrays[0]), 1 << 20, stream_handle(streams[1]))
    streams[1].synchronize()
"""
PINNED = PEER_COPY + """
from numba.cuda.cudadrv.devices import get_context
pinned = []
for d in (0, 1):
    with cuda.gpus[d]:
        buffer = get_context().memhostalloc(1 << 20, mapped=False, portable=True, wc=False)
        pinned.append(np.ndarray(shape=(1 << 20,), dtype=np.uint8, buffer=buffer))
"""
CUPY = PINNED + """
import cupy
from cupy.cuda import device as cupy_device
handles, cupy_streams = [], []
for d in (0, 1):
    with cuda.gpus[d], cupy.cuda.Device(d):
        handles.append(cupy_device.get_cublas_handle())
        s = cupy.cuda.Stream.from_external(streams[d]) if hasattr(cupy.cuda.Stream, "from_external") else cupy.cuda.ExternalStream(stream_handle(streams[d]), d)
        cupy_streams.append(s)
        s.use()
        x = cupy.ones((64, 64), dtype=cupy.float16)
        cupy.matmul(x, x)
        streams[d].synchronize()
"""
CUDA_CORE = CUPY + """
from cuda.core import Stream
core_streams = [Stream.from_handle(stream_handle(s)) for s in streams]
"""
TORCH = CUDA_CORE + """
import torch
torch_streams = [torch.cuda.ExternalStream(stream_handle(streams[d]), device=torch.device("cuda", d)) for d in (0, 1)]
for d in (0, 1):
    with torch.cuda.stream(torch_streams[d]):
        y = torch.ones(64, 64, device=f"cuda:{d}", dtype=torch.float16) @ torch.ones(64, 64, device=f"cuda:{d}", dtype=torch.float16)
    torch_streams[d].synchronize()
"""
HOSTFUNC = TORCH + """
from runtime.backends.cuda.completion import HostFuncNotifier
notifier = HostFuncNotifier(2)
for d in (0, 1):
    with cuda.gpus[d]:
        notifier.after(d, streams[d], None)
done = {}
while sum(done.values()) < 2:
    for lane, count in notifier.wait(timeout=1.0).items():
        done[lane] = done.get(lane, 0) + count
notifier.close()
"""
RUN = """
from runtime import execute
from runtime.backends.cuda import CudaBackend
from tools.synthetic import random_memgraph
graph = random_memgraph(5, vertices=2000, devices=2)
backend = CudaBackend({options})
result = execute(graph, backend=backend, order="nondet", seed=1)
print("moved", result.summary.bytes_moved, "bytes")
"""
TEARDOWN = """
import gc
del result, backend
gc.collect()
"""
RESET = TEARDOWN + """
from numba import cuda
for d in (0, 1):
    with cuda.gpus[d]:
        cuda.synchronize()
cuda.close()
"""
HARD_EXIT = """
import os, sys
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""

SCENARIOS = {
    "two contexts (numba)": TWO_CONTEXTS,
    "+ peer access": PEERS,
    "+ a peer copy": PEER_COPY,
    "+ portable pinned memory": PINNED,
    "+ CuPy cuBLAS handles and streams": CUPY,
    "+ cuda.core streams": CUDA_CORE,
    "+ torch on both GPUs": TORCH,
    "+ the host-function notifier": HOSTFUNC,
    "a run over 2 GPUs (default notifier)": RUN.format(options=""),
    "a run over 2 GPUs, thread left on GPU 1 at close": "from runtime.backends.cuda import CudaBackend; CudaBackend._restore_device = lambda self: None\n" + RUN.format(options=""),
    "a run over 2 GPUs, no release at close": RUN.format(options="release_at_close=False"),
    "a run over 2 GPUs, poll notifier": "import sys; sys.path.insert(0, 'bench'); import notifiers\n" + RUN.format(options='notifier="poll"'),
    "a run over 2 GPUs, then del + gc": RUN.format(options="") + TEARDOWN,
    "a run over 2 GPUs, then numba's cuda.close()": RUN.format(options="") + RESET,
    "a run over 1 GPU of the two": RUN.format(options="").replace("devices=2", "devices=1"),
    "a run over 2 GPUs, then os._exit (control)": RUN.format(options="") + HARD_EXIT,
}


def run(name: str, code: str, timeout: float) -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONFAULTHANDLER": "1", "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))}
    began = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as expired:
        rc, out, err = "timeout", str(expired.stdout or ""), str(expired.stderr or "")
    lines = [line for line in err.splitlines() if line.strip()]
    return {"scenario": name, "rc": rc, "seconds": round(time.perf_counter() - began, 1), "stdout": out[-2000:],
            "stderr": "\n".join(lines[-60:]), "last": lines[-1] if lines else ""}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every scenario's stderr tail here")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per scenario")
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    args = parser.parse_args(argv)
    results = []
    print("| scenario | exit status | seconds | last stderr line |\n| --- | --- | --- | --- |", flush=True)
    for name, code in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        result = run(name, code, args.timeout)
        results.append(result)
        print(f"| {name} | {result['rc']} | {result['seconds']} | {result['last'][:120]} |", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    for result in results:
        if result["rc"] not in (0, "timeout"):
            print(f"\n## {result['scenario']} (exit {result['rc']})\n{result['stderr'][-3000:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
