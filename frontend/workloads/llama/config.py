"""LLaMA-family model configs: presets, and Hugging Face `config.json` files in their old and new spellings.

Families (`model_type`): `llama` (Llama 1-3.x: GQA, llama3 RoPE, tied embeddings), `mistral` (a causal
sliding window of `sliding_window` keys, transformers' default 4096 when the key is absent, none when
null) and `qwen2` (biases on the q, k and v projections; its per-layer sliding window is refused).
`LlamaConfig` holds what the prefill needs. `from_hf` reads an HF config dict the way transformers'
`LlamaConfig` does: `num_key_value_heads` defaults to the head count, `head_dim` to hidden / heads,
`rms_norm_eps` to 1e-6; RoPE comes from `rope_parameters` (transformers 5) or from a top-level
`rope_theta` plus `rope_scaling` (4.x; `rope_scaling` wins, as in transformers), with `type` as an old
name of `rope_type`; the dtype from `dtype` or `torch_dtype`. What the graph cannot express (another
model_type, biases other than qwen2's q/k/v ones, an activation other than silu, partial rotary,
unsupported RoPE types, qwen2's sliding layers) is refused with one line naming the field and its value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from frontend.model_folder import model_file
from turnip_ir.errors import InputError
from turnip_ir.limits import json_document
from turnip_ir.kernels import DTYPE_BYTES

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")
FAMILIES = ("llama", "mistral", "qwen2")
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
    """The end-of-sequence ids (`config.json` gives one id or a list); generation stops on them only when asked."""
    model_type: str = "llama"
    sliding_window: int | None = None
    """Each query sees itself and the `sliding_window - 1` keys before it (mistral); None: every earlier key."""
    qkv_bias: bool = False
    """The q, k and v projections add a bias (qwen2: `self_attn.{q,k,v}_proj.bias`)."""


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
    if path.is_dir():
        path = model_file(path, "config.json", "config file")
    if not path.is_file():
        raise InputError(f"config '{text}' is neither a preset ({', '.join(PRESETS)}) nor a JSON file or model folder")
    try:
        doc = json_document(path.read_text())
    except (OSError, UnicodeDecodeError, InputError) as err:
        raise InputError(f"config '{path}' is not readable JSON: {err}") from None
    return from_hf(doc, str(path))


def from_hf(doc: dict, where: str) -> LlamaConfig:
    """The config an HF `config.json` document describes; `where` names it in errors."""
    if not isinstance(doc, dict):
        raise InputError(f"config '{where}': expected a JSON object")
    _refuse_unsupported(doc, where)
    heads = _int(doc, "num_attention_heads", where)
    hidden = _int(doc, "hidden_size", where)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=_int(doc, "intermediate_size", where),
        num_hidden_layers=_int(doc, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=_int(doc, "num_key_value_heads", where, heads),
        head_dim=_int(doc, "head_dim", where, hidden // heads),
        vocab_size=_int(doc, "vocab_size", where, 32000),
        rms_norm_eps=_float(doc, "rms_norm_eps", where, 1e-6),
        max_position_embeddings=_int(doc, "max_position_embeddings", where, 2048),
        rope=_rope(doc, where),
        dtype=_dtype(doc, where),
        name=where,
        tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        eos_token_id=_ids(doc.get("eos_token_id"), "eos_token_id", where),
        model_type=doc.get("model_type", "llama"),
        sliding_window=_window(doc, where),
        qkv_bias=doc.get("model_type") == "qwen2",
    )
    if config.num_attention_heads % config.num_key_value_heads:
        raise InputError(f"config '{where}': num_key_value_heads {config.num_key_value_heads} does not divide num_attention_heads {heads}")
    if config.head_dim % 2:
        raise InputError(f"config '{where}': head_dim {config.head_dim} must be even for RoPE")
    return config


def _refuse_unsupported(doc: dict, where: str) -> None:
    """One line naming the first field whose value the graph cannot express."""
    family = doc.get("model_type", "llama")
    if family not in FAMILIES:
        _refuse(where, "model_type", family, f"supported: {', '.join(FAMILIES)}")
    if doc.get("hidden_act", "silu") != "silu":
        _refuse(where, "hidden_act", doc["hidden_act"], "only silu")
    for key in ("attention_bias", "mlp_bias"):
        if doc.get(key):
            _refuse(where, key, doc[key], "the graph has no bias terms but qwen2's q/k/v ones")
    if family == "qwen2" and doc.get("use_sliding_window") and _sliding_layers(doc):
        _refuse(where, "use_sliding_window", doc["use_sliding_window"], "qwen2's per-layer sliding window is not built; "
                "set it false or max_window_layers to num_hidden_layers")
    kinds = set(doc.get("layer_types") or ()) - {"full_attention"}
    if kinds and family != "mistral":  # mistral's transformers class ignores layer_types
        _refuse(where, "layer_types", sorted(kinds), "only full_attention layers")


def _refuse(where: str, key: str, value, why: str) -> None:
    shown = json.dumps(value) if not isinstance(value, str) else f"'{value}'"
    raise InputError(f"config '{where}': {key} {shown} is not supported ({why})")


def _sliding_layers(doc: dict) -> bool:
    """Whether qwen2 slides on some layer: layers from `max_window_layers` on (transformers' rule)."""
    if doc.get("sliding_window") is None:
        return False
    return doc.get("max_window_layers", 28) < doc.get("num_hidden_layers", 0)


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
        raise InputError(f"config '{where}': rope_parameters must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InputError(f"config '{where}': rope type '{kind}' is not supported (supported: {', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InputError(f"config '{where}': partial_rotary_factor other than 1 is not supported")
    theta = params.get("rope_theta", doc.get("rope_theta", 10000.0))
    rope = Rope(theta=_number(theta, "rope_theta", where), type=kind)
    if kind == "default":
        return rope
    fields = {"factor": _number(params.get("factor"), "rope factor", where)}
    if kind == "llama3":
        fields["low_freq_factor"] = _number(params.get("low_freq_factor"), "low_freq_factor", where)
        fields["high_freq_factor"] = _number(params.get("high_freq_factor"), "high_freq_factor", where)
        original = params.get("original_max_position_embeddings", doc.get("max_position_embeddings", 2048))
        fields["original_max_position_embeddings"] = int(_number(original, "original_max_position_embeddings", where))
    return Rope(theta=rope.theta, type=kind, **fields)


def _dtype(doc: dict, where: str) -> str:
    value = doc.get("dtype") or doc.get("torch_dtype") or "float32"
    value = "float32" if value == "auto" else str(value).removeprefix("torch.")
    if value not in DTYPE_BYTES:
        raise InputError(f"config '{where}': dtype '{value}' is not one of {', '.join(DTYPE_BYTES)}")
    return value


def _ids(value, key: str, where: str) -> tuple[int, ...]:
    """None, one integer or a list of integers, as a tuple."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InputError(f"config '{where}': {key} must be an integer or a list of integers, got {value!r}")
    return tuple(values)


def _int(doc: dict, key: str, where: str, default: int | None = None) -> int:
    value = doc.get(key)
    value = default if value is None else value  # configs write null for "the default"
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"config '{where}': {key} must be a positive integer, got {value!r}")
    return value


def _float(doc: dict, key: str, where: str, default: float) -> float:
    value = doc.get(key)
    return _number(default if value is None else value, key, where)


def _number(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InputError(f"config '{where}': {key} must be a positive number, got {value!r}")
    return float(value)
