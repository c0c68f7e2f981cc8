"""torch's views of arena views cut from one tensor over the whole arena (attention.cut_view): the same
bytes, shape and strides as the view, or None where the view does not lie whole in the arena. Checked
with host tensors (the cut is pointer arithmetic; the cuda backend asserts the address as well)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from runtime.backends.cuda.attention import cut_view  # noqa: E402


def _arena(nbytes: int):
    whole = torch.arange(nbytes, dtype=torch.int64).remainder(251).to(torch.uint8)
    typed = {"float16": whole.view(torch.float16), "bfloat16": whole.view(torch.bfloat16), "float32": whole.view(torch.float32)}
    return whole, (whole.data_ptr(), typed)


@pytest.mark.parametrize("dtype, item", [("float16", 2), ("bfloat16", 2), ("float32", 4)])
def test_a_cut_view_reads_the_bytes_the_arena_view_reads(dtype, item):
    whole, tensors = _arena(1 << 12)
    host = whole.numpy()
    rows, cols, row_stride, offset = 5, 6, 40 * item, 24 * item  # a strided [5, 6] block at byte 24 x item
    cut = cut_view(tensors, tensors[0] + offset, (rows, cols), (row_stride, item), dtype)
    assert cut is not None and cut.data_ptr() == tensors[0] + offset
    assert tuple(cut.shape) == (rows, cols) and tuple(cut.stride()) == (row_stride // item, 1)
    expected = np.lib.stride_tricks.as_strided(host[offset:], (rows, cols * item), (row_stride, 1))
    assert np.array_equal(cut.contiguous().view(torch.uint8).numpy().reshape(rows, cols * item), expected)


def test_views_not_whole_in_the_arena_or_misaligned_are_not_cut():
    _, tensors = _arena(1 << 10)
    start = tensors[0]
    assert cut_view(tensors, start - 2, (4,), (2,), "float16") is None  # before the arena
    assert cut_view(tensors, start + (1 << 10) - 4, (4,), (2,), "float16") is None  # past its end
    assert cut_view(tensors, start + 1, (4,), (2,), "float16") is None  # half an element in
    assert cut_view(tensors, start, (4, 2), (3, 2), "float16") is None  # a stride of half elements
    assert cut_view(tensors, start, (4,), (1,), "uint8") is None  # a dtype it has no tensor in
    assert cut_view(tensors, start + (1 << 10) - 8, (4,), (2,), "float16") is not None  # the last 8 bytes
    assert cut_view(tensors, start, (0, 3), (6, 2), "float16") is not None  # empty: anywhere in it
