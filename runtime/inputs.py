"""Input tensors for a run: read from an .npz keyed by taskgraph input id, the rest drawn from a seed.

A missing input is `np.random.default_rng(seed).standard_normal(shape).astype(dtype)` with one generator
per input, seeded from (seed, input id), so an input's values do not depend on which others were given.
"""

from __future__ import annotations

import zlib
import zipfile
from pathlib import Path

import numpy as np

from turnip_ir.errors import InputError


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file, by key."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise InputError(f"inputs file '{path}' does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise InputError(f"inputs file '{path}' is not a readable .npz: {err}") from None


def input_specs(memgraph) -> dict[str, tuple[tuple[int, ...], str]]:
    """Taskgraph input id -> (shape, dtype), from the memgraph's input vertices."""
    return {node.task: (tuple(node.shape), node.dtype) for node in memgraph.nodes if node.op == "input"}


def make_inputs(specs: dict[str, tuple[tuple[int, ...], str]], given: dict[str, np.ndarray] | None, seed: int) -> dict[str, np.ndarray]:
    """Check the given arrays against `specs` and draw the missing ones."""
    given = dict(given or {})
    for key in given:
        if key not in specs:
            raise InputError(f"input '{key}' is not an input of the graph (inputs: {', '.join(specs) or 'none'})")
    arrays = {}
    for task, (shape, dtype) in specs.items():
        if task in given:
            arrays[task] = _checked(task, np.asarray(given[task]), shape, dtype)
        else:
            arrays[task] = random_input(task, shape, dtype, seed)
    return arrays


def random_input(task: str, shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    if dtype == "bfloat16":
        raise InputError(f"input '{task}': bfloat16 inputs cannot be made with numpy")
    rng = np.random.default_rng([seed, zlib.crc32(task.encode())])
    return rng.standard_normal(shape).astype(dtype)


def _checked(task: str, array: np.ndarray, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if tuple(array.shape) != shape:
        raise InputError(f"input '{task}': shape {list(array.shape)} does not match the graph's {list(shape)}")
    if array.dtype.name != dtype:
        raise InputError(f"input '{task}': dtype {array.dtype.name} does not match the graph's {dtype}")
    return array
