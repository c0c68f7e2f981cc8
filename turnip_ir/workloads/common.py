"""Helpers every workload shares: seeded random arrays and config checks."""

from __future__ import annotations

import zlib
from dataclasses import fields

import numpy as np

from turnip_ir.errors import InputError


def rng(seed: int, name: str) -> np.random.Generator:
    """A generator for one named tensor, so its values do not depend on which others are drawn."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def normal(seed: int, name: str, shape: tuple[int, ...], dtype: str, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
    return (mean + std * rng(seed, name).standard_normal(shape)).astype(dtype)


def check_positive(config, *names: str) -> None:
    """One-line errors for config fields that must be positive integers."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{type(config).__name__}.{name} must be a positive integer, got {value!r}")


def field_names(config_type) -> list[str]:
    return [f.name for f in fields(config_type)]
