"""Partition specs: how one dimension of a whole tensor is cut into blocks.

A split is a tuple of block sizes that add up to the dimension (`(32, 32, 32, 32)` for 128 in 4). Users
write a spec as a block count (`4`: near-equal blocks, the larger ones first) or as explicit sizes; the
frontend keeps the tuple. Blocks of a split start at the running sums of the sizes before them.
`split_packed` cuts sequences packed end to end so that every block holds whole sequences or a piece of
one: what blocked attention over packed sequences needs to keep one kernel per block simple.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from turnip_ir.errors import InputError

Split = tuple[int, ...]
SplitSpec = int | Sequence[int]


def split_count(size: int, parts: int) -> Split:
    """`size` in `parts` near-equal blocks, the larger ones first (`split_count(10, 3) == (4, 3, 3)`)."""
    if not 1 <= parts <= max(size, 1):
        raise InputError(f"cannot cut a dimension of {size} into {parts} blocks")
    base, extra = divmod(size, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def split_block(size: int, block: int) -> Split:
    """`size` in blocks of `block`, the last one smaller when `block` does not divide it."""
    if block < 1:
        raise InputError(f"a block size must be positive, got {block}")
    full, rest = divmod(size, block)
    return (block,) * full + ((rest,) if rest else ()) or (size,)


def split_packed(lengths: Sequence[int], block: int) -> Split:
    """Blocks of at most `block` tokens over sequences of `lengths` packed end to end, in order: a sequence
    joins the last block where it fits in the room left, else starts a new one; a sequence longer than
    `block` takes blocks of its own (`split_block`), the last one closed to the sequences after it. So a
    block holds either whole sequences or one piece of one sequence. (`split_packed([5, 2, 2, 9], 4) ==
    (4, 1, 4, 4, 4, 1)`.)"""
    if block < 1:
        raise InputError(f"a block size must be positive, got {block}")
    sizes: list[int] = []
    room = 0
    for length in lengths:
        if length > block:
            sizes += split_block(length, block)
            room = 0
        elif length <= room:
            sizes[-1] += length
            room -= length
        else:
            sizes.append(length)
            room = block - length
    return tuple(sizes)


def as_split(size: int, spec: SplitSpec | None, what: str) -> Split:
    """A spec (None = one block, a count, or sizes) checked against the dimension `size`."""
    if spec is None:
        return (size,)
    if isinstance(spec, bool):
        raise InputError(f"{what}: a split must be a block count or a list of block sizes, got {spec!r}")
    if isinstance(spec, int):
        return split_count(size, spec)
    sizes = tuple(spec)
    if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
        raise InputError(f"{what}: block sizes {list(sizes)} must be positive integers")
    if sum(sizes) != size:
        raise InputError(f"{what}: block sizes {list(sizes)} add up to {sum(sizes)}, not {size}")
    return sizes


def starts(split: Split) -> tuple[int, ...]:
    """Where each block begins."""
    return (0, *accumulate(split))[:-1]


def block_slice(split: Split, index: int) -> slice:
    """The elements of block `index` of a dimension cut by `split`."""
    begin = starts(split)[index]
    return slice(begin, begin + split[index])
