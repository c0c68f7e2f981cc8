"""Does a second 2-GPU run in one process work? Which part of the backend makes it fail?

    source bench/gpu_setup.sh && python3 bench/investigations/repeat_check.py [--json out.json]     # on nvidia-h200-x2

On 2026-12-01 (fourth sitting) the GPU tests ran the tiny llama over 2 GPUs three times in one pytest
process: the first run passed, the next two failed at their first cuBLAS GEMM on GPU 0
(CUBLAS_STATUS_INTERNAL_ERROR), and the process segfaulted at exit. On 2026-11-30 the same tests passed,
before `close` released every CUDA object (`release_at_close`) and before the notifier's side streams.
Since then `close` also unbinds CuPy's cuBLAS handles and current streams from the run's streams
(`detach_at_close`). The likelier cause, found after: a run assumed the thread was on GPU 0 when it began
(`current_device = 0`), so after a run over two GPUs that ended on GPU 1, the next run's first GEMM on
GPU 0 went to GPU 0's cuBLAS handle from GPU 1's context. Now the first submit always switches, and
`close` puts the thread back on the device it found. The variants take each half of that fix away.
Each variant below is a fresh interpreter running four 2-GPU llama runs in a row with one thing changed;
it prints, per run, ok or the error, and the process's exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exit_check import run  # noqa: E402

RUNS = """
import numpy as np
from dataclasses import replace
from passes.insert_offload import minimum_budget
from passes.pipeline import compile_taskgraph
from passes.place_devices import place_devices
from runtime import execute
from runtime.backends.cuda import CudaBackend
from frontend.workloads import llama
from frontend.workloads.llama.float64_forward import float64_forward
{setup}
config = replace(llama.load_config("tiny-gqa"), dtype="float32")
weights = llama.RandomWeights(config, 2)
ids = llama.random_ids(config, 256, 2)
want = float64_forward(config, weights, ids)
for placement in ("sequence", "layers", "heads", "sequence"):
    built = llama.build_llama(config, 256, block=64, gpus={gpus}, placement=placement)
    memgraph = compile_taskgraph(built.graph, int(minimum_budget(place_devices(built.graph, 0)) * 1.5))
    try:
        result = execute(memgraph, backend=CudaBackend({options}), order="nondet", inputs=built.feed(weights, ids))
        got = built.gather(result.outputs).astype(np.float64)
        print(placement, "ok", f"{{np.max(np.abs(got - want)) / np.max(np.abs(want)):.1e}}", flush=True)
    except Exception as err:
        print(placement, "FAILED", str(err)[:160], flush=True)
"""

OLD_START = """
_set_up = CudaBackend._set_up
def _assume_gpu0(self, graph):
    _set_up(self, graph)
    self.current_device = 0
CudaBackend._set_up = _assume_gpu0
"""
NO_RESTORE = "CudaBackend._restore_device = lambda self: None"

VARIANTS = {
    "as is": dict(),
    "before the fix (GPU 0 assumed at the start, not restored at close)": dict(setup=OLD_START + NO_RESTORE),
    "GPU 0 assumed at the start, restored at close": dict(setup=OLD_START),
    "switch at the start, not restored at close": dict(setup=NO_RESTORE),
    "no release, no detach": dict(options="release_at_close=False, detach_at_close=False"),
    "one GPU (control)": dict(gpus=1),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    results = []
    for name, variant in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        code = RUNS.format(setup=variant.get("setup", ""), options=variant.get("options", ""), gpus=variant.get("gpus", 2))
        result = run(name, code, args.timeout)
        results.append(result)
        runs = " | ".join(line for line in result["stdout"].splitlines() if line.split(" ")[0] in ("sequence", "layers", "heads"))
        print(f"- {name}: exit {result['rc']} ({result['seconds']} s): {runs}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    for result in results:
        if result["rc"] not in (0, "timeout"):
            print(f"\n## {result['scenario']} (exit {result['rc']})\n{result['stderr'][-1500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
