"""Helpers every workload shares: seeded random arrays, config checks and configs from text."""

from __future__ import annotations

import zlib
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from turnip_ir.errors import InputError
from turnip_ir.files import is_file
from turnip_ir.limits import json_document, quoted, shorten


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
            raise InputError(f"{type(config).__name__}.{name} must be a positive integer, got {shorten(repr(value))}")


def field_names(config_type) -> list[str]:
    return [f.name for f in fields(config_type)]


def config_from_text(config_type, presets: dict, text: str | None, default: str):
    """A workload config from a preset name, a JSON file, or inline JSON ('{"n": 512}'); JSON keys
    override the `default` preset's fields."""
    text = default if text is None else text
    if text in presets:
        return presets[text]
    try:
        doc = json_document(Path(text).read_text() if is_file(text) else text)
    except (OSError, UnicodeDecodeError, InputError):
        raise InputError(f"config {quoted(text)} is neither a preset ({', '.join(presets)}), a JSON file nor inline JSON") from None
    if not isinstance(doc, dict):
        raise InputError(f"config {quoted(text)}: expected a JSON object")
    known = field_names(config_type)
    for key in doc:
        if key not in known:
            raise InputError(f"config {quoted(text)}: unknown key {quoted(key)} (known: {', '.join(known)})")
    return replace(presets[default], **doc)
