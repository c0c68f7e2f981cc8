"""LLaMA-family model configs: presets, and Hugging Face `config.json` files in their old and new spellings.

Families (`model_type`): `llama` (Llama 1-3.x: GQA, llama3 RoPE, tied embeddings), `mistral` (a causal
sliding window of `sliding_window` keys, transformers' default 4096 when the key is absent, none when
null) and `qwen2` (biases on the q, k and v projections; its per-layer sliding window is refused).
`LlamaConfig` holds what the prefill needs. `from_hf` reads an HF config dict the way transformers'
`LlamaConfig` does: `num_key_value_heads` defaults to the head count, `head_dim` to hidden / heads,
`rms_norm_eps` to 1e-6; RoPE comes from `rope_parameters` (transformers 5) or from a top-level
`rope_theta` plus `rope_scaling` (4.x; `rope_scaling` wins, as in transformers), with `type` as an old
name of `rope_type`; the dtype from `dtype` or `torch_dtype`; the end-of-sequence ids from a
`generation_config.json` beside config.json where there is one (as transformers' `generate` reads them).
What the graph cannot express (another model_type, biases other than qwen2's q/k/v ones, an activation
other than silu, partial rotary, unsupported RoPE types, qwen2's sliding layers) is refused with one
line naming the field and its value.
So is a value of the wrong type (a string or a number where a bool goes: `"tie_word_embeddings": "false"`
is refused, as transformers refuses it), a size outside 1 to its `MAXIMA`, a float that is not finite or
outside its range (`rms_norm_eps` in (0, 1], `rope_theta` above 1, RoPE factors), a token id outside the
vocabulary, and a hidden size that is not a multiple of the head count (transformers' rule).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from frontend.model_folder import check_folder, model_file
from turnip_ir.errors import InputError
from turnip_ir.files import is_file, is_folder
from turnip_ir.limits import INT_LIMIT, json_document, quoted, shorten
from turnip_ir.kernels import DTYPE_BYTES, known_dtype

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")
MAXIMA = {"hidden_size": 1 << 20, "intermediate_size": 1 << 22, "num_hidden_layers": 1 << 12, "num_attention_heads": 1 << 12,
          "num_key_value_heads": 1 << 12, "head_dim": 1 << 12, "vocab_size": 1 << 24, "max_position_embeddings": 1 << 28,
          "original_max_position_embeddings": 1 << 28, "sliding_window": 1 << 28, "max_window_layers": 1 << 12}
"""The largest value of each size field: many times the largest published model's (hidden 16384, intermediate
53248, 126 layers, 128 heads, head_dim 256, a vocabulary of 262144, 10M positions), so a typo or a hostile
file is one line here, not a weight table of 10^12 values or a loop over 10^9 layers later."""
EPS_RANGE = (0.0, 1.0, False)
"""`rms_norm_eps` above 0, at most 1 (published models use 1e-6 to 1e-5): (low, high, low included)."""
THETA_RANGE = (1.0, math.inf, False)
"""`rope_theta` above 1: a base of 1 or less makes frequencies of 1 or more, overflowing to NaN tables."""
FACTOR_RANGE = (1.0, math.inf, True)
"""A RoPE scaling `factor` of 1 or more (transformers' rule: below 1 it would stretch positions, not shrink)."""
BLEND_RANGE = (0.0, math.inf, False)
"""llama3's `low_freq_factor` and `high_freq_factor`, above 0."""
FAMILIES = ("llama", "mistral", "qwen2")
GENERATION_FILE = "generation_config.json"
MISTRAL_WINDOW = 4096
"""transformers' `MistralConfig.sliding_window` when config.json does not name it."""


@dataclass(frozen=True)
class Rope:
    """RoPE parameters: the base and, for scaled types, the scaling constants."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: Rope
    dtype: str
    name: str = "custom"
    tie_word_embeddings: bool = False
    """The LM head is the embedding table (transformers' default for LlamaConfig is False)."""
    eos_token_id: tuple[int, ...] = ()
    """The end-of-sequence ids (one id or a list, from generation_config.json beside config.json when there is
    one, else config.json: `load_config`); generation stops on them only when asked."""
    model_type: str = "llama"
    sliding_window: int | None = None
    """Each query sees itself and the `sliding_window - 1` keys before it (mistral); None: every earlier key."""
    qkv_bias: bool = False
    """The q, k and v projections add a bias (qwen2: `self_attn.{q,k,v}_proj.bias`)."""

    def __post_init__(self) -> None:
        known_dtype(self.dtype)  # a bfloat16 model registers numpy's bfloat16 (a config made or replaced in code too)


_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "vocab_size": 256, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "dtype": "float32"}
PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    "tiny-gqa": {**_TINY, "num_key_value_heads": 2},
    # meta-llama/Llama-2-7b-hf's config.json (rope_theta absent: 10000)
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
           "torch_dtype": "float16", "rope_scaling": None},
}
DEFAULT_TOKENS = {"tiny": 128, "tiny-gqa": 128, "7b": 8192}


def load_config(text: str) -> LlamaConfig:
    """A preset name, a JSON file (an HF `config.json` or the same keys), or an HF model folder."""
    if text in PRESETS:
        return from_hf(PRESETS[text], text)
    path = Path(text)
    if is_folder(path):
        check_folder(path)
        path = model_file(path, "config.json", "config file")
    if not is_file(path):
        raise InputError(f"config {quoted(text)} is neither a preset ({', '.join(PRESETS)}) nor a JSON file or model folder")
    try:
        doc = json_document(path.read_text())
    except (OSError, UnicodeDecodeError, InputError) as err:
        raise InputError(f"config '{path}' is not readable JSON: {err}") from None
    return from_hf(_with_generation_eos(doc, path), str(path))


def _with_generation_eos(doc, path: Path):
    """The end-of-sequence ids as transformers' `generate` takes them: a `generation_config.json` beside a
    `config.json` wins wholly (an id, a list such as Llama-3-Instruct's, or none), else config.json's own."""
    beside = path.parent / GENERATION_FILE
    if path.name != "config.json" or not beside.is_file() or not isinstance(doc, dict):
        return doc
    try:
        generation = json_document(beside.read_text())
    except (OSError, UnicodeDecodeError, InputError) as err:
        raise InputError(f"generation config '{beside}' is not readable JSON: {err}") from None
    if not isinstance(generation, dict):
        raise InputError(f"generation config '{beside}': expected a JSON object")
    return {**doc, "eos_token_id": list(_ids(generation.get("eos_token_id"), "eos_token_id", str(beside)))}


def from_hf(doc: dict, where: str) -> LlamaConfig:
    """The config an HF `config.json` document describes; `where` names it in errors."""
    if not isinstance(doc, dict):
        raise InputError(f"config '{where}': expected a JSON object")
    _refuse_unsupported(doc, where)
    heads = _int(doc, "num_attention_heads", where)
    hidden = _int(doc, "hidden_size", where)
    if hidden % heads:  # as transformers' LlamaConfig, whatever head_dim says
        raise InputError(f"config '{where}': hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    vocab = _int(doc, "vocab_size", where, 32000)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=_int(doc, "intermediate_size", where),
        num_hidden_layers=_int(doc, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=_int(doc, "num_key_value_heads", where, heads),
        head_dim=_int(doc, "head_dim", where, hidden // heads),
        vocab_size=vocab,
        rms_norm_eps=_float(doc, "rms_norm_eps", where, 1e-6, EPS_RANGE),
        max_position_embeddings=_int(doc, "max_position_embeddings", where, 2048),
        rope=_rope(doc, where),
        dtype=_dtype(doc, where),
        name=where,
        tie_word_embeddings=_bool(doc, "tie_word_embeddings", where),
        eos_token_id=_ids(doc.get("eos_token_id"), "eos_token_id", where, vocab),
        model_type=doc.get("model_type", "llama"),
        sliding_window=_window(doc, where),
        qkv_bias=doc.get("model_type") == "qwen2",
    )
    _ids(doc.get("bos_token_id"), "bos_token_id", where, vocab)  # not used, but a wrong one is a wrong config
    if config.num_attention_heads % config.num_key_value_heads:
        raise InputError(f"config '{where}': num_key_value_heads {config.num_key_value_heads} does not divide num_attention_heads {heads}")
    if config.head_dim % 2:
        raise InputError(f"config '{where}': head_dim {config.head_dim} must be even for RoPE")
    if config.rope.type == "dynamic" and config.head_dim < 4:
        raise InputError(f"config '{where}': head_dim {config.head_dim} is too small for dynamic RoPE (4 or more)")
    return config


def _refuse_unsupported(doc: dict, where: str) -> None:
    """One line naming the first field whose value the graph cannot express."""
    family = doc.get("model_type", "llama")
    if family not in FAMILIES:
        _refuse(where, "model_type", family, f"supported: {', '.join(FAMILIES)}")
    if doc.get("hidden_act", "silu") != "silu":
        _refuse(where, "hidden_act", doc["hidden_act"], "only silu")
    for key in ("attention_bias", "mlp_bias"):
        if _bool(doc, key, where):
            _refuse(where, key, doc[key], "the graph has no bias terms but qwen2's q/k/v ones")
    if family == "qwen2" and _bool(doc, "use_sliding_window", where) and _sliding_layers(doc, where):
        _refuse(where, "use_sliding_window", doc["use_sliding_window"], "qwen2's per-layer sliding window is not built; "
                "set it false or max_window_layers to num_hidden_layers")
    kinds = doc.get("layer_types") or []
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        raise InputError(f"config '{where}': layer_types must be a list of strings, got {_shown(kinds)}")
    kinds = set(kinds) - {"full_attention"}
    if kinds and family != "mistral":  # mistral's transformers class ignores layer_types
        _refuse(where, "layer_types", sorted(kinds), "only full_attention layers")


def _refuse(where: str, key: str, value, why: str) -> None:
    raise InputError(f"config '{where}': {key} {_shown(value)} is not supported ({why})")


def _shown(value) -> str:
    """A config value as a diagnostic shows it: a string quoted, anything else as JSON; shortened."""
    if isinstance(value, str):
        return quoted(value)
    try:
        return shorten(json.dumps(value))
    except (TypeError, ValueError):  # a document from Python rather than JSON: not serializable
        return shorten(repr(value))


def _sliding_layers(doc: dict, where: str) -> bool:
    """Whether qwen2 slides on some layer: layers from `max_window_layers` on (transformers' rule)."""
    if doc.get("sliding_window") is None:
        return False
    return _int(doc, "max_window_layers", where, 28, low=0) < _int(doc, "num_hidden_layers", where)


def _window(doc: dict, where: str) -> int | None:
    """mistral's window (transformers' default when absent, none when null); other families attend fully."""
    if doc.get("model_type") != "mistral":
        return None
    if "sliding_window" not in doc:
        return MISTRAL_WINDOW
    if doc["sliding_window"] is None:
        return None
    return _int(doc, "sliding_window", where)


def _rope(doc: dict, where: str) -> Rope:
    """RoPE as transformers standardizes it: `rope_scaling` or `rope_parameters`, then the top-level theta."""
    params = doc.get("rope_scaling") or doc.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise InputError(f"config '{where}': rope_parameters must be an object, got {_shown(params)}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InputError(f"config '{where}': rope type {_shown(kind)} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InputError(f"config '{where}': partial_rotary_factor other than 1 is not supported")
    theta = params.get("rope_theta", doc.get("rope_theta", 10000.0))
    rope = Rope(theta=_number(theta, "rope_theta", where, THETA_RANGE), type=kind)
    if kind == "default":
        return rope
    fields = {"factor": _number(params.get("factor"), "rope factor", where, FACTOR_RANGE)}
    if kind == "llama3":
        low = fields["low_freq_factor"] = _number(params.get("low_freq_factor"), "low_freq_factor", where, BLEND_RANGE)
        high = fields["high_freq_factor"] = _number(params.get("high_freq_factor"), "high_freq_factor", where, BLEND_RANGE)
        if high <= low:  # the blend between them divides by high - low
            raise InputError(f"config '{where}': high_freq_factor {high:g} must be more than low_freq_factor {low:g}")
        original = params.get("original_max_position_embeddings", doc.get("max_position_embeddings", 2048))
        fields["original_max_position_embeddings"] = _int({"original_max_position_embeddings": original},
                                                          "original_max_position_embeddings", where)
    return Rope(theta=rope.theta, type=kind, **fields)


def _dtype(doc: dict, where: str) -> str:
    value = doc.get("dtype") or doc.get("torch_dtype") or "float32"
    value = "float32" if value == "auto" else str(value).removeprefix("torch.")
    if value not in DTYPE_BYTES:  # a bfloat16 one is registered when the config is made (`__post_init__`)
        raise InputError(f"config '{where}': dtype {quoted(value)} is not one of {', '.join(DTYPE_BYTES)}")
    return value


def _ids(value, key: str, where: str, vocab: int | None = None) -> tuple[int, ...]:
    """A token id field's value: null, one id or a list of ids, each in the vocabulary (when given), as a tuple."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InputError(f"config '{where}': {key} must be an integer or a list of integers, got {_shown(value)}")
    bad = [v for v in values if v < 0 or (vocab is not None and v >= vocab)]
    if bad:
        within = f"the vocabulary [0, {vocab})" if vocab is not None else "0 or more"
        raise InputError(f"config '{where}': {key} {shorten(str(bad[0]))} is not a token id of {within}")
    return tuple(values)


def _int(doc: dict, key: str, where: str, default: int | None = None, low: int = 1) -> int:
    """An integer field from `low` to its `MAXIMA` (or `INT_LIMIT`); null or absent: `default`."""
    value = doc.get(key)
    value = default if value is None else value  # configs write null for "the default"
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer of {low} or more"
        raise InputError(f"config '{where}': {key} must be {kind}, got {_shown(value)}")
    most = MAXIMA.get(key, INT_LIMIT - 1)
    if value > most:
        raise InputError(f"config '{where}': {key} {shorten(str(value))} is more than {most}, the largest this frontend builds")
    return value


def _bool(doc: dict, key: str, where: str) -> bool:
    """A true/false field (null or absent: false); a string or a number is refused, as transformers does."""
    value = doc.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InputError(f"config '{where}': {key} must be true or false, got {_shown(value)}")
    return value


def _float(doc: dict, key: str, where: str, default: float, bounds: tuple[float, float, bool]) -> float:
    value = doc.get(key)
    return _number(default if value is None else value, key, where, bounds)


def _number(value, key: str, where: str, bounds: tuple[float, float, bool]) -> float:
    """A finite number in `bounds`: (low, high, whether low itself is allowed); high is allowed."""
    low, high, closed = bounds
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number) or not (low <= number if closed else low < number) or number > high:
        limit = "" if high == math.inf else f" and at most {high:g}"
        raise InputError(f"config '{where}': {key} must be a finite number {'from' if closed else 'above'} "
                         f"{low:g}{limit}, got {_shown(value)}")
    return number
