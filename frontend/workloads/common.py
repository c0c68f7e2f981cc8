"""Helpers every workload shares: seeded random arrays, config checks and configs from text."""

from __future__ import annotations

import json
import zlib
from dataclasses import fields, replace
from pathlib import Path

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


def config_from_text(config_type, presets: dict, text: str | None, default: str):
    """A workload config from a preset name, a JSON file, or inline JSON ('{"n": 512}'); JSON keys
    override the `default` preset's fields."""
    text = default if text is None else text
    if text in presets:
        return presets[text]
    path = Path(text)
    try:
        doc = json.loads(path.read_text() if path.is_file() else text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"config '{text}' is neither a preset ({', '.join(presets)}), a JSON file nor inline JSON") from None
    if not isinstance(doc, dict):
        raise InputError(f"config '{text}': expected a JSON object")
    known = field_names(config_type)
    for key in doc:
        if key not in known:
            raise InputError(f"config '{text}': unknown key '{key}' (known: {', '.join(known)})")
    return replace(presets[default], **doc)
