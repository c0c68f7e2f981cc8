"""The cpu backend's kernels equal the formulas of tests/kernel_formulas.py, kernel by kernel, on
broadcasting, zero-size and batched operands (the property tests then check them inside whole plans)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_formulas import FORMULAS, apply

from runtime.kernels_numpy import NUMPY_KERNELS
from turnip_ir.kernels import KERNELS

UNARY_SHAPES = [(3, 4), (5,), (2, 3, 4), (0, 4), (4, 0)]
BROADCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((3, 4), ()), ((0, 4), (4,)), ((3, 0), (1, 0))]
CASES = {
    "matmul": [((3, 4), (4, 5)), ((0, 4), (4, 5)), ((3, 0), (0, 5))],
    "einsum": [
        ("ij,jk->ik", (3, 4), (4, 5)),
        ("ij->ji", (3, 4)),
        ("ij->j", (3, 4)),
        ("ij,ij->i", (3, 4), (3, 4)),
        ("i,j->ij", (3,), (5,)),
        ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
        ("ii->i", (3, 3)),
        ("ij->", (0, 4)),
    ],
    "add": BROADCAST,
    "sub": BROADCAST,
    "mul": BROADCAST,
    "rmsnorm": [(s,) for s in UNARY_SHAPES] + [((3, 4), (4,)), ((2, 3, 4), (4,)), ((4, 0), (0,))],
    "rope": [((6, 8), (6, 4), (6, 4)), ((5, 4), (5, 4), (5, 4)), ((0, 8), (0, 4), (0, 4))],
    "swiglu": [((3, 4), (3, 4)), ((0, 4), (0, 4))],
    "rows": [((5, 4),), ((3,),), ((3, 0),), ((2, 3, 4),)],
    "concat": [((3, 4), (2, 4)), ((0, 4), (2, 4), (1, 4)), ((3,),), ((1, 2, 3), (2, 2, 3))],
    "attention": [],  # its own test below: a float32 partial beside float64 blocks
    "decode_attention": [],  # its own tests: tests/test_decode_attention.py
    "rmsnorm_grad": [((3, 4), (3, 4)), ((3, 4), (4,), (3, 4)), ((2, 3, 4), (4,), (2, 3, 4))],
    "swiglu_grad": [((3, 4), (3, 4), (3, 4)), ((0, 4), (0, 4), (0, 4))],
    # their own tests, with float32 partials and labels: tests/test_autodiff.py
    **dict.fromkeys(["cast", "attention_unpack", "attention_grad", "xent", "xent_loss", "xent_grad"], []),
}


def _cases():
    for name in KERNELS:
        for case in CASES.get(name, [(s,) for s in UNARY_SHAPES]):
            yield pytest.param(name, case, id=f"{name}-{case}")


def test_every_kernel_has_a_formula():
    assert set(FORMULAS) == set(KERNELS), "write the missing kernels' formulas in tests/kernel_formulas.py"


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an empty row is no reason to warn
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name, case", list(_cases()))
def test_cpu_kernel_equals_its_formula(name, case, dtype):
    attrs = {"einsum": {"equation": case[0]}, "scale": {"factor": 0.5}, "rmsnorm": {"eps": 1e-5}, "rmsnorm_grad": {"eps": 1e-5},
             "rows": {"start": 1, "stop": 2}}.get(name, {})
    shapes = case[1:] if name == "einsum" else case
    rng = np.random.default_rng(len(shapes))
    xs = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    shape, _ = KERNELS[name].infer([x.shape for x in xs], [dtype] * len(xs), attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS[name](xs, out, attrs)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == "float64" else {"rtol": 2e-6, "atol": 2e-6}
    np.testing.assert_allclose(out, apply(name, xs, attrs), **tol)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal, final, with_prev", [(True, True, False), (False, False, False), (False, True, True), (True, True, True), (False, False, True)])
def test_cpu_attention_equals_its_formula(heads, kv_heads, causal, final, with_prev):
    rng = np.random.default_rng(heads * 7 + kv_heads)
    tokens, width = 5, 3
    q = rng.standard_normal((tokens, heads * width))
    k, v = (rng.standard_normal((tokens, kv_heads * width)) for _ in range(2))
    xs = [q, k, v]
    if with_prev:  # the partial a previous key block leaves, made by the formula itself
        earlier = [q, rng.standard_normal(k.shape), rng.standard_normal(v.shape)]
        xs.append(apply("attention", earlier, {"heads": heads, "kv_heads": kv_heads, "final": False}).astype(np.float32))
    attrs = {"heads": heads, "kv_heads": kv_heads, "causal": causal, "final": final}
    shape, dtype = KERNELS["attention"].infer([x.shape for x in xs], [str(x.dtype) for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS["attention"](xs, out, attrs)
    np.testing.assert_allclose(out, apply("attention", xs, attrs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window, offset, causal", [(2, 0, True), (3, -4, False), (1, -1, False), (7, -9, False), (4, -3, False)])
@pytest.mark.parametrize("with_prev", [False, True])
def test_cpu_attention_with_a_sliding_window_equals_its_formula(window, offset, causal, with_prev):
    """Keys a window hides are masked exactly, rows that see no key of a block keep the earlier ones' partial."""
    rng = np.random.default_rng(window * 10 - offset)
    tokens, width, heads, kv_heads = 5, 3, 4, 2
    q = rng.standard_normal((tokens, heads * width))
    k, v = (rng.standard_normal((tokens, kv_heads * width)) for _ in range(2))
    xs = [q, k, v]
    if with_prev:
        earlier = [q, rng.standard_normal(k.shape), rng.standard_normal(v.shape)]
        xs.append(apply("attention", earlier, {"heads": heads, "kv_heads": kv_heads, "final": False}).astype(np.float32))
    attrs = {"heads": heads, "kv_heads": kv_heads, "causal": causal, "final": with_prev, "window": window, "offset": offset}
    shape, dtype = KERNELS["attention"].infer([x.shape for x in xs], [str(x.dtype) for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS["attention"](xs, out, attrs)
    want = apply("attention", xs, attrs)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    unwindowed = apply("attention", xs, {key: value for key, value in attrs.items() if key not in ("window", "offset")})
    assert not np.allclose(want, unwindowed)  # the window hides some key


@pytest.mark.parametrize("attrs, message", [
    ({"window": 0}, "window 0 must be at least 1"),
    ({"offset": -2}, "there is no window"),
    ({"window": 2, "offset": -1, "causal": True}, "got offset -1"),
])
def test_attention_window_attributes_are_checked(attrs, message):
    from turnip_ir.errors import ShapeError

    with pytest.raises(ShapeError, match=message):
        KERNELS["attention"].infer([(4, 8)] * 3, ["float32"] * 3, {"heads": 2, "kv_heads": 2, **attrs})


@pytest.mark.parametrize("segments, window", [("2", None), ("1,3", None), ("1,2,3,4", None), ("3", 2)])
@pytest.mark.parametrize("final, with_prev", [(True, False), (False, False), (True, True)])
def test_cpu_attention_over_packed_sequences_equals_its_formula(segments, window, final, with_prev):
    """A segmented causal block: each row sees the keys of its own sequence up to itself, none of another's."""
    rng = np.random.default_rng(len(segments))
    tokens, width, heads, kv_heads = 5, 3, 4, 2
    q = rng.standard_normal((tokens, heads * width))
    k, v = (rng.standard_normal((tokens, kv_heads * width)) for _ in range(2))
    xs = [q, k, v]
    if with_prev:
        earlier = [q, rng.standard_normal(k.shape), rng.standard_normal(v.shape)]
        xs.append(apply("attention", earlier, {"heads": heads, "kv_heads": kv_heads, "final": False}).astype(np.float32))
    attrs = {"heads": heads, "kv_heads": kv_heads, "causal": True, "final": final, "segments": segments}
    attrs |= {} if window is None else {"window": window}
    shape, dtype = KERNELS["attention"].infer([x.shape for x in xs], [str(x.dtype) for x in xs], attrs)
    out = np.full(shape, np.nan, dtype=dtype)
    NUMPY_KERNELS["attention"](xs, out, attrs)
    want = apply("attention", xs, attrs)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    whole = apply("attention", xs, {name: value for name, value in attrs.items() if name != "segments"})
    assert not np.allclose(want, whole)  # the sequences hide each other's keys


@pytest.mark.parametrize("attrs, message", [
    ({"segments": "2"}, "segments '2' cut a causal block only"),
    ({"segments": "", "causal": True}, "segments '' must be comma-separated row offsets"),
    ({"segments": "1, 2", "causal": True}, "segments '1, 2' must be comma-separated row offsets"),
    ({"segments": "-1", "causal": True}, "segments '-1' must be comma-separated row offsets"),
    ({"segments": "0,2", "causal": True}, "segments '0,2' must increase strictly inside \\(0, 4\\)"),
    ({"segments": "2,2", "causal": True}, "segments '2,2' must increase strictly inside"),
    ({"segments": "3,1", "causal": True}, "segments '3,1' must increase strictly inside"),
    ({"segments": "4", "causal": True}, "segments '4' must increase strictly inside \\(0, 4\\)"),
    ({"segments": 2, "causal": True}, "attribute 'segments' must be str, got 2"),
])
def test_attention_segments_are_checked(attrs, message):
    from turnip_ir.errors import ShapeError

    with pytest.raises(ShapeError, match=message):
        KERNELS["attention"].infer([(4, 8)] * 3, ["float32"] * 3, {"heads": 2, "kv_heads": 2, **attrs})


def test_a_segmented_block_costs_each_sequences_causal_flops():
    spec = KERNELS["attention"]
    shapes = [(10, 8)] * 3
    causal = {"heads": 2, "kv_heads": 2, "causal": True}
    one = lambda rows: spec.flops([(rows, 8)] * 3, (rows, 8), causal)  # noqa: E731
    assert spec.flops(shapes, (10, 8), causal | {"segments": "3,7"}) == one(3) + one(4) + one(3)
    assert spec.flops(shapes, (10, 8), causal | {"segments": "3,7"}) < spec.flops(shapes, (10, 8), causal)
