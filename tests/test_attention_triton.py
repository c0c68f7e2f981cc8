"""The `triton` attention provider's kernel, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1).

Skipped where triton or torch is not installed (the `torch` extra; CI has neither); the GPU runs the same
kernel through tests/test_cuda_gpu.py's provider test. Triton reads TRITON_INTERPRET when it is imported,
and the variable must not leak into a process that runs the kernel on a GPU, so each check runs in a
subprocess of its own (`python -m tests.test_attention_triton CHECK`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests import formulas_llama as formulas
from turnip_ir.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tensors(rng, tokens, d, *counts):
    import torch

    return [torch.from_numpy(rng.standard_normal((tokens, n * d)).astype(np.float16)) for n in counts]


def check_full_then_diagonal(heads: int, kv_heads: int, tokens: int) -> None:
    """A full block writes the packed partial; the causal diagonal block folds itself in and writes the final
    output, which must equal causal attention over both key blocks (float64 formulas)."""
    import torch

    from runtime.backends.cuda import attention_triton as A

    d = 16
    q, k0, v0, k1, v1 = _tensors(np.random.default_rng(tokens), tokens, d, heads, kv_heads, kv_heads, kv_heads, kv_heads)
    scale = 1.0 / np.sqrt(d)
    partial = torch.zeros(tokens, heads * d + heads, dtype=torch.float32)
    A.launch(q, k0, v0, None, partial, heads, kv_heads, causal=False, final=False, scale=scale)
    np.testing.assert_allclose(partial[:, : heads * d].numpy(), formulas.attention(q.numpy(), k0.numpy(), v0.numpy(), heads, kv_heads, causal=False), rtol=2e-2, atol=2e-2)
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = q.numpy()[:, h * d : (h + 1) * d].astype(np.float64) @ k0.numpy()[:, g * d : (g + 1) * d].astype(np.float64).T * scale
        top = scores.max(1)
        np.testing.assert_allclose(partial[:, heads * d + h].numpy(), top + np.log(np.exp(scores - top[:, None]).sum(1)), rtol=1e-2, atol=1e-2)
    out = torch.zeros(tokens, heads * d, dtype=torch.float16)
    A.launch(q, k1, v1, partial, out, heads, kv_heads, causal=True, final=True, scale=scale)
    keys, values = torch.cat([k0, k1]).numpy(), torch.cat([v0, v1]).numpy()
    want = formulas.attention(q.numpy(), keys, values, heads, kv_heads, causal=True, offset=tokens)
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2e-2, atol=2e-2)


def check_lone_causal_block() -> None:
    import torch

    from runtime.backends.cuda import attention_triton as A

    heads, kv_heads, tokens, d = 2, 1, 70, 32
    q, k, v = _tensors(np.random.default_rng(1), tokens, d, heads, kv_heads, kv_heads)
    out = torch.zeros(tokens, heads * d, dtype=torch.float16)
    A.launch(q, k, v, None, out, heads, kv_heads, causal=True, final=True, scale=0.3)
    want = formulas.attention(q.numpy(), k.numpy(), v.numpy(), heads, kv_heads, causal=True, scale=0.3)
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2e-2, atol=2e-2)


CHECKS = {
    "grouped": lambda: check_full_then_diagonal(4, 2, 48),
    "plain": lambda: check_full_then_diagonal(2, 2, 80),
    "causal": check_lone_causal_block,
}

# The tile shapes the checks run under ($TURNIP_TRITON_ATTENTION): the default (one tile of rows at these
# sizes), and small tiles, so causal blocks take the unmasked sweep below the diagonal and several row
# tiles, with key counts that fill the last tile (48, 80) and one that does not (70).
CONFIGS = {"default": None, "small-tiles": "32,16,4,2", "square-tiles": "16,16,4,1"}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_kernel_under_the_interpreter_equals_the_formulas(check, config):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    env.pop("TURNIP_TRITON_ATTENTION", None)
    if CONFIGS[config]:
        env["TURNIP_TRITON_ATTENTION"] = CONFIGS[config]
    done = subprocess.run([sys.executable, "-m", "tests.test_attention_triton", check], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_tile_shape_is_four_integers_with_rows_a_multiple_of_columns(monkeypatch):
    from runtime.backends.cuda import attention_triton as A

    assert A.Config.parse("64,32,4,2") == A.Config(64, 32, 4, 2)
    bad_ones = (("64,32,4", "four integers"), ("a,b,c,d", "four integers"), ("32,64,4,2", "multiple"), ("64,0,4,3", "powers of two"),
                ("-64,64,4,3", "powers of two"), ("96,32,4,3", "powers of two"), ("64,8,4,3", "powers of two"), ("64,64,3,3", "WARPS"),
                ("64,64,4,0", "STAGES"))
    for bad, says in bad_ones:
        with pytest.raises(InputError, match=says):
            A.Config.parse(bad)
    monkeypatch.setenv(A.ENVIRONMENT, "64,64,4,3")
    assert A.default_config(128) == A.Config(64, 64, 4, 3)
    monkeypatch.delenv(A.ENVIRONMENT)
    assert A.default_config(128).block_m % A.default_config(128).block_n == 0


def test_the_provider_takes_half_precision_power_of_two_heads_only():
    """bfloat16 is checked on the GPU only (tests/test_cuda_bf16.py): Triton's interpreter computes `tl.dot`
    of bfloat16 tiles wrongly (eye @ 2 eye gave 2.7e8 on its diagonal), so the checks above stay float16."""
    from runtime.backends.cuda import attention_triton as A

    assert A.supported(32, 8, 128, "float16") and A.supported(32, 8, 128, "bfloat16")
    assert not A.supported(32, 8, 128, "float32")
    assert not A.supported(4, 4, 24, "float16")


def test_the_provider_decides_per_vertex_from_its_heads_and_first_operand():
    from types import SimpleNamespace

    from runtime.backends.cuda.attention import triton_takes

    grouped = SimpleNamespace(attrs={"heads": 32, "kv_heads": 8})
    assert triton_takes(grouped, SimpleNamespace(shape=(4096, 32 * 128), dtype="float16"))
    assert not triton_takes(grouped, SimpleNamespace(shape=(4096, 32 * 128), dtype="float32"))  # runs on cublas
    assert not triton_takes(SimpleNamespace(attrs={"heads": 4, "kv_heads": 4}), SimpleNamespace(shape=(8, 4 * 24), dtype="float16"))


if __name__ == "__main__":
    CHECKS[sys.argv[1]]()
