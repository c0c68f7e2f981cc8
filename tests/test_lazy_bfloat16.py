"""ml_dtypes (numpy's bfloat16, 0.6 s to import on a 2-core VM) is imported at the first bfloat16 a process
meets, not at every start: a float16 command does not pay for it, and a bfloat16 model, taskgraph or
checkpoint still resolves "bfloat16" everywhere. Fresh interpreters: the test process has imported it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_commands_start_without_ml_dtypes():
    out = _run("import sys, turnip, turnip_cli.main, turnip_cli.planning, turnip_cli.generate_cmd, frontend.safetensors\n"
               "print('ml_dtypes' in sys.modules)")
    assert out.strip() == "False"


def test_a_bfloat16_model_generates_in_a_fresh_process(tmp_path):
    from frontend.workloads.llama.config import PRESETS

    doc = {k: v for k, v in PRESETS["tiny"].items() if k != "dtype"} | {"torch_dtype": "bfloat16"}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(doc))
    out = _run("import sys\nfrom turnip import Session\n"
               f"with Session(config={str(config)!r}, memory='64MiB', backend='cpu') as s:\n"
               "    r = s.generate([[1, 2, 3, 4]], 3)\n"
               "print(r.tokens.shape, 'ml_dtypes' in sys.modules)")
    assert out.strip() == "(1, 3) True"


def test_bfloat16_taskgraphs_and_checkpoints_resolve_in_a_fresh_process(tmp_path):
    graph = json.loads((ROOT / "examples" / "blocked_matmul.json").read_text().replace("float32", "bfloat16"))
    path = tmp_path / "bf16.json"
    path.write_text(json.dumps(graph))
    out = _run("import json, numpy as np\nfrom turnip_ir.json_taskgraph import taskgraph_from_json\n"
               f"g = taskgraph_from_json(json.loads(open({str(path)!r}).read()))\n"
               "print(np.dtype('bfloat16').name)")
    assert out.strip() == "bfloat16"
    out = _run("import numpy as np\nfrom frontend.safetensors import save_file, SafeTensors\n"
               f"save_file({{'w': np.ones((2, 2), np.float32)}}, {str(tmp_path / 'w.safetensors')!r}, bfloat16=('w',))\n"
               f"print(SafeTensors.open({str(tmp_path / 'w.safetensors')!r}).raw('w').dtype.name)")
    assert out.strip() == "bfloat16"
