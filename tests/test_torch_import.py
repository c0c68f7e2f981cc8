"""torch's import begun early on a thread (runtime/backends/cuda/attention.py `import_torch_soon`): once a
process, only where torch is installed and not imported, and the first `import torch` elsewhere waits for it;
a session starts it on a GPU alone (not under the CUDA simulator, not on other backends)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_import_runs_once_on_its_thread_and_an_import_elsewhere_waits_for_it():
    out = _python("""
import sys
from runtime.backends.cuda import attention
assert 'torch' not in sys.modules
attention.import_torch_soon(); attention.import_torch_soon()
assert len(attention._torch_import) == 1 and attention._torch_import[0].name == 'turnip torch import'
import torch  # waits for the thread's import
assert torch.cuda.is_available() in (True, False) and 'torch' in sys.modules
print(attention.have_torch_cuda() == torch.cuda.is_available())
""")
    assert out.strip() == "True"


@pytest.mark.parametrize("backend,sim,started", [("cuda", "0", True), ("cuda", "1", False), ("cpu", "0", False)])
def test_a_session_starts_it_on_a_gpu_alone(backend, sim, started):
    out = _python(f"""
from runtime.backends.cuda import attention
from turnip import session
session._import_torch_soon({backend!r}, 'auto')
session._import_torch_soon({backend!r}, 'cublas')
print(len(attention._torch_import))
""", NUMBA_ENABLE_CUDASIM=sim)
    assert out.strip() == ("1" if started else "0")
