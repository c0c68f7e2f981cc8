"""One sequence's KV cache on the host during a generation: per layer, k and v rows in buffers with room
for every new token, so a step appends its row by writing it, not by copying the cache (a 7b batch of
16 at 2k tokens holds 17 GB of caches). `cache[layer]` is (k, v) [length, kv_width], views of the rows
filled so far, what `DecodeStep.feed` reads.
"""

from __future__ import annotations

import numpy as np


class KvCache:
    """The rows of one sequence so far, per layer, with `room` rows free for the steps to come."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], room: int):
        self.length = len(layers[0][0]) if layers else 0
        self.buffers = [tuple(_with_room(t, room) for t in pair) for pair in layers]

    def __len__(self) -> int:
        return len(self.buffers)

    def __getitem__(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        k, v = self.buffers[layer]
        return k[: self.length], v[: self.length]

    def append(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """One new (k, v) row [kv_width] per layer."""
        for (k, v), (k_row, v_row) in zip(self.buffers, rows, strict=True):
            if self.length == len(k):
                raise IndexError("the cache has no room for another row")  # the caller sized it: an internal error
            k[self.length] = k_row
            v[self.length] = v_row
        self.length += 1


def _with_room(rows: np.ndarray, room: int) -> np.ndarray:
    buffer = np.empty((rows.shape[0] + room, rows.shape[1]), dtype=rows.dtype)
    buffer[: rows.shape[0]] = rows
    return buffer
