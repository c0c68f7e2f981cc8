"""The Python API's edges (issue 47): temperatures too small to divide by, NaN or inf weights and logits,
two threads on one session, and wrong arguments, each a one-line `InputError` (or a documented warning),
never a hang, a silent wrong token or another exception."""

from __future__ import annotations

import numpy as np
import pytest

from turnip import Session
from turnip.sampling import next_tokens

PROMPTS = [np.array([1, 2, 3]), np.array([4, 5])]


# ----- temperatures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300, 1e-30])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature, dtype):
    logits = np.array([[0.5, 3.0, -2.0, 1.0, 2.0], [-1.0, -3.0, 0.0, 4.0, 3.999]], dtype=dtype)
    rng = np.random.default_rng(0)
    for _ in range(10):
        assert next_tokens(logits, temperature, 1.0, rng).tolist() == [1, 3]


def test_a_session_at_temperature_1e_320_gives_the_greedy_tokens():
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        greedy = session.generate(PROMPTS, 4).tokens
        tiny = session.generate(PROMPTS, 4, temperature=1e-320, seed=3).tokens
    np.testing.assert_array_equal(tiny, greedy)
