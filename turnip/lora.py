"""LoRA adapters: made new as PEFT makes them, read and written as PEFT's adapter folders, with the optimizer
state beside them.

An `Adapter` is its settings (`LoraSettings`: rank r, alpha, the targeted projections of every layer) and its
float32 tensors by name, PEFT's keys without the `base_model.model.` prefix:
`model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]; the projection
computes W x + (alpha / r) B A x. `Adapter.new` initialises as PEFT's `LoraLayer.reset_lora_parameters` does
(A from `nn.init.kaiming_uniform_(a=sqrt(5))`, which is uniform in +-1/sqrt(in), B zero), drawn with numpy
from the seed: PEFT's distribution, not torch's generator's numbers.

A folder (`read`, `files`): `adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules, lora_dropout
0, bias "none", task_type CAUSAL_LM, base_model_name_or_path), `adapter_model.safetensors` (float32, PEFT's
keys) and, written by turnip, `optimizer.safetensors`: AdamW's moments (`exp_avg.{name}`, `exp_avg_sq.{name}`)
and, in its metadata, the update count, the steps taken, the examples read and an fp16 run's loss scale, so
that a later run goes on where this one stopped. An adapter PEFT wrote (after its own training) has no
state: a run from it starts AdamW afresh. Its targets are read from the tensors (a `target_modules` list
must name projections the model has; a string, a pattern to PEFT, is not read); what this LoRA cannot
express (DoRA, rsLoRA, biases, per-module ranks, layer subsets, modules_to_save) is refused in one line
naming the field, as is a tensor the model has no place for or of another shape. `MergedWeights` is a
model's weights with an adapter merged in, for running the base model with it (prefill, generation:
`Session(adapter=...)`, whose argument `adapter_of` reads and checks, and `--adapter` of turnip generate
and turnip llama).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from frontend.lazy import LazyTensor
from frontend.safetensors import SafeTensors, file_contents
from frontend.workloads.llama import LlamaConfig, LoraSpec
from frontend.workloads.llama.train import MODULES
from runtime.inputs import fill
from turnip.optimizer import AdamState, LossScaler, TrainingState, positive_number
from turnip_ir.errors import InputError
from turnip_ir.files import Contents, is_file, is_folder, write_all
from turnip_ir.limits import PATH_CHARS, quoted

PROJECTIONS = tuple(MODULES)
"""What LoRA may target, in the model's order (the training graph's `MODULES`)."""
PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
STATE_FILE = "optimizer.safetensors"
STATE_FORMAT = "turnip-lora-adamw"
KEY = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_[AB]\.weight")
UNSUPPORTED = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "modules_to_save": None,
               "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}, "bias": "none"}
"""adapter_config.json fields this LoRA reads only at these values (a missing field is PEFT's default, the same)."""


@dataclass(frozen=True)
class LoraSettings:
    """Adapters of rank `rank` on the `targets` projections of every layer, scaled by alpha / rank (alpha
    None: 2 rank)."""

    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
            raise InputError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        alpha = 2 * self.rank if self.alpha is None else positive_number(self.alpha, "LoRA alpha")
        unknown = [t for t in self.targets if t not in PROJECTIONS]
        if unknown or not self.targets:
            raise InputError(f"LoRA target '{unknown[0] if unknown else ''}' is not a projection of the model "
                             f"(it has {', '.join(PROJECTIONS)})")
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "targets", tuple(t for t in PROJECTIONS if t in self.targets))

    @property
    def spec(self) -> LoraSpec:
        """The training graph's description of these adapters (frontend/workloads/llama/train.py)."""
        return LoraSpec(self.rank, self.alpha, self.targets)

    @property
    def scaling(self) -> float:
        return self.spec.scaling

    @property
    def summary(self) -> str:
        """How the commands name these settings: "LoRA r 8, alpha 16 on q_proj,v_proj"."""
        return f"LoRA r {self.rank}, alpha {self.alpha:g} on {','.join(self.targets)}"

    def shapes(self, config: LlamaConfig) -> dict[str, tuple[int, int]]:
        """Every adapter tensor's name and shape, layer by layer in the model's order, A before B."""
        return self.spec.shapes(config)


@dataclass
class Adapter:
    """LoRA settings and float32 tensors by name (module docstring)."""

    settings: LoraSettings
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    base_model: str | None = None

    @classmethod
    def new(cls, config: LlamaConfig, settings: LoraSettings, seed: int, base_model: str | None = None) -> Adapter:
        """A fresh adapter as PEFT initialises one: A uniform in +-1/sqrt(in), B zero."""
        rng = np.random.default_rng(seed)
        tensors = {}
        for name, (rows, cols) in settings.shapes(config).items():
            if ".lora_A." in name:
                bound = 1 / math.sqrt(cols)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) times sqrt(3 / fan_in)
                tensors[name] = rng.uniform(-bound, bound, (rows, cols)).astype(np.float32)
            else:
                tensors[name] = np.zeros((rows, cols), np.float32)
        return cls(settings, tensors, base_model)

    @classmethod
    def read(cls, folder: str | Path, config: LlamaConfig) -> tuple[Adapter, TrainingState | None]:
        """A PEFT LoRA folder's adapter, checked against `config`, and the optimizer state beside it (None
        where there is none)."""
        folder = Path(folder)
        if not is_folder(folder):  # False too for a name the system refuses (too long, a NUL)
            raise InputError(f"adapter folder {quoted(str(folder), PATH_CHARS)} does not exist")
        doc = _config_doc(folder / CONFIG_FILE)
        stored = SafeTensors.open(folder / WEIGHTS_FILE)
        names = {_unprefixed(key, folder): key for key in stored.names()}
        settings = _settings(doc, names, config, folder)
        tensors = {}
        for name, shape in settings.shapes(config).items():
            if name not in names:
                raise InputError(f"adapter '{folder}' has no tensor '{PREFIX}{name}' (r {settings.rank} on {', '.join(settings.targets)})")
            found = stored.shape(names[name])
            if found != shape:
                raise InputError(f"adapter '{folder}': tensor '{names[name]}' has shape {list(found)}, the model needs {list(shape)}")
            tensors[name] = np.array(stored.get(names[name], np.float32))
        base = doc.get("base_model_name_or_path")
        adapter = cls(settings, tensors, base if isinstance(base, str) else None)
        state = folder / STATE_FILE
        return adapter, (read_state(state, adapter) if state.is_file() else None)

    def save(self, folder: str | Path, state: TrainingState | None = None) -> list[Path]:
        """Write the adapter folder (made if missing), with `state` beside it: every file or none."""
        Path(folder).mkdir(exist_ok=True)
        written = write_all(self.files(folder, state))
        if state is None:
            (Path(folder) / STATE_FILE).unlink(missing_ok=True)  # an earlier run's state is not this adapter's
        return written

    def files(self, folder: str | Path, state: TrainingState | None = None) -> list[tuple[Path, Contents]]:
        """The folder's files (module docstring) as (path, contents), for `write_all` (the folder must exist)."""
        folder = Path(folder)
        alpha = int(self.settings.alpha) if float(self.settings.alpha).is_integer() else self.settings.alpha
        doc = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": self.base_model,
               "r": self.settings.rank, "lora_alpha": alpha, "target_modules": list(self.settings.targets),
               "lora_dropout": 0.0, "inference_mode": True, "init_lora_weights": True, **UNSUPPORTED}
        weights, _ = file_contents({PREFIX + name: t for name, t in self.tensors.items()}, folder / WEIGHTS_FILE,
                                   {"format": "pt"})  # PEFT's own metadata: transformers checks "format"
        files = [(folder / CONFIG_FILE, json.dumps(doc, indent=2) + "\n"), (folder / WEIGHTS_FILE, weights)]
        if state is not None:
            files.append((folder / STATE_FILE, state_contents(state, folder / STATE_FILE)))
        return files


class MergedWeights(Mapping):
    """A model's weights with an adapter merged in, as PEFT's `merge_and_unload` merges it: each targeted
    projection W + (alpha / r) B A (summed in float32, float64 for a float64 W, then in W's dtype), every
    other weight as the source gives it. A prefill or generation over these runs the base model with the
    adapter and no change to its graph. `lazy(name)` keeps the source's laziness: an untargeted weight is
    the source's own lazy input (a checkpoint's tensor, still read in place where it can be), a targeted one
    a `MergedTensor`, merged block by block as it is written, so the model is never held on the host twice."""

    def __init__(self, source: Mapping[str, np.ndarray], adapter: Adapter):
        self.source, self.adapter = source, adapter

    def __getitem__(self, name: str) -> np.ndarray:
        if self._factors(name) is None:
            return self.source[name]
        return self.lazy(name).materialize()

    def lazy(self, name: str) -> LazyTensor:
        """Weight `name` as a lazy input (frontend/lazy.py), merged where the adapter targets it."""
        source_lazy = getattr(self.source, "lazy", None)
        base = source_lazy(name) if callable(source_lazy) else np.asarray(self.source[name])
        factors = self._factors(name)
        if factors is None and isinstance(base, LazyTensor):
            return base
        return MergedTensor(base, *(factors or (None, None)), self.adapter.settings.scaling)

    def _factors(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(B, A) of the projection `name` when the adapter targets it, else None."""
        module = name.removesuffix(".weight")
        a = self.adapter.tensors.get(f"{module}.lora_A.weight")
        return None if a is None else (self.adapter.tensors[f"{module}.lora_B.weight"], a)

    def __contains__(self, name) -> bool:
        return name in self.source

    def __iter__(self):
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)


class MergedTensor(LazyTensor):
    """A weight W (an array or a lazy input) plus scaling B A, or a block of it (`MergedWeights`): a block
    [rows, cols] is W's block, then scaling B[rows] A[:, cols] added in float32 (float64 for a float64 W)
    and rounded once to W's dtype. Without B and A it is W alone (an array given a lazy input's face)."""

    def __init__(self, base, b: np.ndarray | None, a: np.ndarray | None, scaling: float):
        super().__init__(tuple(base.shape), base.dtype)
        self.base, self.b, self.a, self.scaling = base, b, a, scaling

    def write_into(self, out: np.ndarray) -> None:
        fill(out, self.base[self.index] if self.index else self.base)
        if self.a is None:
            return
        rows, cols = (*self.index, slice(None), slice(None))[:2]
        wide = np.float64 if self.dtype == np.float64 else np.float32
        delta = wide(self.scaling) * (self.b[rows].astype(wide) @ self.a[:, cols].astype(wide))
        np.copyto(out, (out.astype(wide) + delta).astype(self.dtype))


def adapter_of(adapter: Adapter | str | Path | None, config: LlamaConfig) -> Adapter | None:
    """A model's adapter as a session is given it: None, a PEFT LoRA folder (`Adapter.read`; an optimizer
    state beside it is not read), or an `Adapter`, checked against `config` (each tensor the settings need,
    of its shape, and no other); one line naming what does not fit."""
    if adapter is None:
        return None
    if isinstance(adapter, (str, os.PathLike)):
        return Adapter.read(adapter, config)[0]
    if not isinstance(adapter, Adapter):
        raise InputError(f"adapter must be a PEFT LoRA folder's path or an Adapter, got {type(adapter).__name__}")
    shapes = adapter.settings.shapes(config)
    for name, tensor in adapter.tensors.items():
        if name not in shapes:
            raise InputError(f"adapter tensor '{name}' is none of the model's (r {adapter.settings.rank} on "
                             f"{', '.join(adapter.settings.targets)} of {config.num_hidden_layers} layers)")
        if tuple(np.shape(tensor)) != shapes[name]:
            raise InputError(f"adapter tensor '{name}' has shape {list(np.shape(tensor))}, the model needs {list(shapes[name])}")
    missing = [name for name in shapes if name not in adapter.tensors]
    if missing:
        raise InputError(f"adapter has no tensor '{missing[0]}' (r {adapter.settings.rank} on {', '.join(adapter.settings.targets)})")
    return adapter


def _config_doc(path: Path) -> dict:
    if not is_file(path):
        raise InputError(f"adapter folder '{path.parent}' has no {CONFIG_FILE}")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"adapter config '{path}' is not readable JSON: {err}") from None
    if not isinstance(doc, dict):
        raise InputError(f"adapter config '{path}': expected a JSON object")
    if doc.get("peft_type") != "LORA":
        raise InputError(f"adapter config '{path}': peft_type is {doc.get('peft_type')!r}, only LORA adapters are read")
    for key, value in UNSUPPORTED.items():
        if doc.get(key, value) not in (value, None, False, {}, []):  # PEFT writes null, false or {} for "off"
            raise InputError(f"adapter config '{path}': {key} {json.dumps(doc[key])} is not supported (only {json.dumps(value)})")
    return doc


def _unprefixed(key: str, folder: Path) -> str:
    """A stored key without PEFT's prefix, or one line for a tensor that is not a LoRA weight of a projection."""
    name = key.removeprefix(PREFIX)
    if not key.startswith(PREFIX) or not KEY.fullmatch(name):
        raise InputError(f"adapter '{folder}': tensor '{key}' is not a LoRA weight of a projection this model has")
    return name


def _settings(doc: dict, names: dict[str, str], config: LlamaConfig, folder: Path) -> LoraSettings:
    """The adapter's rank and alpha (PEFT's defaults, 8 and 8, where the config has none) and targets (a
    target_modules list, names or module paths ending in one, else the projections the tensors hold), each
    target and layer one the model has, and no tensor of another target."""
    found = {}
    for name, key in names.items():
        layer, target = KEY.fullmatch(name).groups()
        if int(layer) >= config.num_hidden_layers or target not in PROJECTIONS:
            what = f"layer {layer}" if target in PROJECTIONS else f"'{target}'"
            raise InputError(f"adapter '{folder}' targets {what} ({key}), which the model lacks "
                             f"({config.num_hidden_layers} layers of {', '.join(PROJECTIONS)})")
        found.setdefault(target, key)
    listed = doc.get("target_modules")
    targets = tuple(found)
    if isinstance(listed, list) and listed:
        targets = tuple(str(t).rsplit(".", 1)[-1] for t in listed)
        lacking = [t for t in targets if t not in PROJECTIONS]
        if lacking:
            raise InputError(f"adapter '{folder}' targets '{lacking[0]}', which the model lacks (its projections: {', '.join(PROJECTIONS)})")
        extra = [key for target, key in found.items() if target not in targets]
        if extra:
            raise InputError(f"adapter '{folder}': tensor '{extra[0]}' is of none of its target_modules ({', '.join(listed)})")
    try:
        return LoraSettings(doc.get("r", 8), doc.get("lora_alpha", 8), targets)
    except InputError as err:
        raise InputError(f"adapter '{folder}': {err}") from None


def state_contents(state: TrainingState, path: Path) -> Contents:
    """`optimizer.safetensors`' contents (module docstring)."""
    tensors = {f"exp_avg.{name}": m for name, m in state.adam.exp_avg.items()}
    tensors |= {f"exp_avg_sq.{name}": v for name, v in state.adam.exp_avg_sq.items()}
    scaler = state.scaler
    metadata = {"format": STATE_FORMAT, "step": str(state.adam.step), "steps_done": str(state.steps_done),
                "examples_seen": str(state.examples_seen)}
    if scaler.enabled:
        metadata |= {"loss_scale": repr(scaler.scale), "good_steps": str(scaler.good_steps)}
    return file_contents(tensors, path, metadata)[0]


def read_state(path: Path, adapter: Adapter) -> TrainingState:
    """The state `state_contents` wrote, checked against the adapter it lies beside."""
    stored = SafeTensors.open(path)
    meta = stored.metadata
    try:
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"format is {meta.get('format')!r}, not {STATE_FORMAT}")
        counts = [int(meta[key]) for key in ("step", "steps_done", "examples_seen")]
        scaled = "loss_scale" in meta
        scaler = LossScaler(True, positive_number(float(meta["loss_scale"]), "loss_scale"), int(meta["good_steps"])) if scaled else LossScaler()
    except (KeyError, ValueError, InputError) as err:
        raise InputError(f"optimizer state '{path}' is not turnip's: {err}") from None
    adam = AdamState(counts[0])
    for moments, kind in ((adam.exp_avg, "exp_avg"), (adam.exp_avg_sq, "exp_avg_sq")):
        for name, tensor in adapter.tensors.items():
            key = f"{kind}.{name}"
            if key not in stored and adam.step == 0:
                continue  # no update made yet: no moments
            if key not in stored:
                raise InputError(f"optimizer state '{path}' has no '{key}': it is not the state of this adapter")
            moments[name] = np.array(stored.get(key, np.float32, shape=tensor.shape))
    return TrainingState(adam, scaler, counts[1], counts[2])
