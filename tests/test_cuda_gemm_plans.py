"""Einsums as GEMM plans (runtime/backends/cuda/gemm.py), checked on the host: a plan, run with strided
numpy views the way cuBLAS reads memory, must equal np.einsum; where no single GEMM exists, no plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.backends.cuda.gemm import numpy_gemm, plan_einsum

LETTERS = "abcdefg"


def _check(equation, shapes, seed=0):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape) for shape in shapes)
    plan = plan_einsum(equation, shapes)
    if plan is None:
        return False
    out = np.full(np.einsum(equation, a, b).shape, np.nan)
    numpy_gemm(plan, a, b, out)
    np.testing.assert_allclose(out, np.einsum(equation, a, b), rtol=1e-12, atol=1e-12)
    return True


@pytest.mark.parametrize(
    "equation",
    ["ij,jk->ik", "ti,oi->to", "it,io->to", "ij,jk->ki", "bij,bjk->bik", "bij,bkj->bik", "bhtd,bhsd->bhts", "ti,hdi->thd", "i,j->ij", "ij,j->i", "bij,jk->bik"],
)
def test_matrix_products_in_any_layout_become_one_gemm(equation):
    sizes = dict(zip("ijkbhtdso", [3, 4, 5, 2, 3, 4, 2, 5, 3]))
    (left, right), _ = equation.split("->")[0].split(","), None
    assert _check(equation, [tuple(sizes[x] for x in left), tuple(sizes[x] for x in right)])


@pytest.mark.parametrize("equation", ["ti,hdi->htd", "ij,jk->jk", "tij,tjk->kit"])
def test_what_is_not_one_gemm_gets_no_plan(equation):
    sizes = dict(zip("ijkhdt", [3, 4, 5, 2, 3, 4]))
    left, right = equation.split("->")[0].split(",")
    assert plan_einsum(equation, [tuple(sizes[x] for x in left), tuple(sizes[x] for x in right)]) is None


@st.composite
def contractions(draw):
    letters = draw(st.permutations(LETTERS[: draw(st.integers(2, 6))]))
    role = {x: draw(st.sampled_from(["batch", "m", "n", "k"])) for x in letters}
    left = [x for x in letters if role[x] in ("batch", "m", "k")]
    right = [x for x in letters if role[x] in ("batch", "n", "k")]
    out = [x for x in letters if role[x] in ("batch", "m", "n")]
    left, right, out = (draw(st.permutations(part)) for part in (left, right, out))
    sizes = {x: draw(st.integers(1, 4)) for x in letters}
    equation = f"{''.join(left)},{''.join(right)}->{''.join(out)}"
    return equation, [tuple(sizes[x] for x in left), tuple(sizes[x] for x in right)]


@settings(max_examples=300, deadline=None)
@given(contractions())
def test_every_plan_computes_its_einsum(case):
    equation, shapes = case
    _check(equation, shapes)
