"""LLaMA configs from presets and Hugging Face config.json files (old and new spellings), and RoPE tables."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pytest

from turnip_ir.errors import InputError
from frontend.workloads.llama import load_config
from frontend.workloads.llama.config import Rope, from_hf
from frontend.workloads.llama.rope import inverse_frequencies, rope_tables
from frontend.workloads.llama.weights import weight_shapes

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def test_7b_preset_is_llama_2_7b():
    config = load_config("7b")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (4096, 11008, 32)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (32, 32, 128)
    assert (config.rms_norm_eps, config.rope, config.dtype) == (1e-5, Rope(theta=10000.0), "float16")


def test_transformers_defaults_fill_missing_keys():
    config = from_hf({**BASE, "num_key_value_heads": None}, "c")
    assert (config.num_key_value_heads, config.head_dim, config.rms_norm_eps) == (4, 16, 1e-6)
    assert (config.vocab_size, config.dtype, config.rope) == (32000, "float32", Rope())
    assert from_hf({**BASE, "head_dim": 32, "torch_dtype": "float16"}, "c").head_dim == 32
    assert from_hf({**BASE, "dtype": "bfloat16", "torch_dtype": "float16"}, "c").dtype == "bfloat16"


def test_old_spelling_rope_theta_and_rope_scaling():
    config = from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}, "c")
    assert config.rope == Rope(theta=500000.0, type="linear", factor=2.0)


def test_new_spelling_rope_parameters():
    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = from_hf({**BASE, "rope_parameters": params}, "c")
    assert config.rope == Rope(500000.0, "llama3", 8.0, 1.0, 4.0, 8192)
    assert from_hf({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "c").rope.theta == 1e6


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"attention_bias": True}, "attention_bias true is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"hidden_size": None}, "hidden_size must be a positive integer, got null"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
    ({"torch_dtype": "int8"}, "dtype 'int8' is not one of"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_scaling": {"rope_type": "linear"}}, "rope factor must be a finite number from 1, got null"),
])
def test_unsupported_or_broken_configs_are_one_line_errors(change, message):
    with pytest.raises(InputError, match=message):
        from_hf({**BASE, **change}, "c")


def test_config_files_folders_and_bad_names(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "vocab_size": 99}))
    assert load_config(str(tmp_path)).vocab_size == 99
    assert load_config(str(tmp_path / "config.json")).vocab_size == 99
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="is not readable JSON"):
        load_config(str(tmp_path / "broken.json"))
    with pytest.raises(InputError, match="config 'huge' is neither a preset"):
        load_config("huge")


def test_rope_tables_follow_the_formula():
    config = from_hf({**BASE, "rope_theta": 500.0}, "c")
    cos, sin = rope_tables(config, 10)
    angle = 7 / 500.0 ** (2 * 3 / 16)  # position 7, frequency index 3 of head_dim 16
    assert cos[7, 3] == pytest.approx(math.cos(angle)) and cos[7, 3 + 8] == cos[7, 3]
    assert sin[7, 3] == pytest.approx(math.sin(angle))


def test_scaled_rope_frequencies():
    default = inverse_frequencies(from_hf(BASE, "c"), 100)
    linear = from_hf({**BASE, "rope_scaling": {"type": "linear", "factor": 4.0}}, "c")
    np.testing.assert_allclose(inverse_frequencies(linear, 100), default / 4)
    dynamic = from_hf({**BASE, "max_position_embeddings": 64, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "c")
    np.testing.assert_array_equal(inverse_frequencies(dynamic, 64), default)  # within the trained length
    grown = 10000.0 * (2.0 * 128 / 64 - 1) ** (16 / 14)
    np.testing.assert_allclose(inverse_frequencies(dynamic, 128), 1 / grown ** (np.arange(0, 16, 2) / 16))
    llama3 = from_hf({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, "c")
    scaled = inverse_frequencies(llama3, 100)
    wavelength = 2 * np.pi / default
    np.testing.assert_array_equal(scaled[wavelength < 16], default[wavelength < 16])  # short waves kept
    np.testing.assert_allclose(scaled[wavelength > 64], default[wavelength > 64] / 8)  # long waves divided


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "arrays and objects nest too deep (at most 200 levels)"),
    ("1" + "0" * 5000, "an integer has thousands of digits"),
    ("NaN", "NaN is not a finite number"),
    ("Infinity", "Infinity is not a finite number"),
    ("1e999", "1e999 is not a finite number"),
], ids=["deep", "digits", "nan", "infinity", "overflow"])
def test_config_json_past_the_readers_bounds_is_one_line(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 64, "rms_norm_eps": ' + text + "}")
    with pytest.raises(InputError) as caught:
        load_config(str(tmp_path))
    assert str(caught.value).startswith(f"config '{path}' is not readable JSON: {message}")


@pytest.mark.parametrize("change, message", [
    ({"rms_norm_eps": math.nan}, "rms_norm_eps must be a finite number above 0 and at most 1, got NaN"),
    ({"rms_norm_eps": math.inf}, "rms_norm_eps must be a finite number above 0 and at most 1, got Infinity"),
    ({"rms_norm_eps": 10.0}, "rms_norm_eps must be a finite number above 0 and at most 1, got 10.0"),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps must be a finite number above 0 and at most 1, got '1e-5'"),
    ({"rope_theta": math.nan}, "rope_theta must be a finite number above 1, got NaN"),
    ({"rope_theta": -math.inf}, "rope_theta must be a finite number above 1, got -Infinity"),
    ({"rope_theta": 10**400}, "rope_theta must be a finite number above 1, got 1000000000"),
    ({"rope_theta": 0.5}, "rope_theta must be a finite number above 1, got 0.5"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false, got 1"),
    ({"attention_bias": "false"}, "attention_bias must be true or false, got 'false'"),
    ({"hidden_size": True}, "hidden_size must be a positive integer, got true"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers must be a positive integer, got 2.0"),
    ({"intermediate_size": -128}, "intermediate_size must be a positive integer, got -128"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
    ({"hidden_size": 66}, "hidden_size 66 is not a multiple of num_attention_heads 4"),
    ({"head_dim": 7}, "head_dim 7 must be even for RoPE"),
    ({"rope_scaling": {"rope_type": "linear", "factor": math.nan}}, "rope factor must be a finite number from 1, got NaN"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "rope factor must be a finite number from 1, got 0.5"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}},
     "high_freq_factor 4 must be more than low_freq_factor 4"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": "8192"}}, "original_max_position_embeddings must be a positive integer"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "head_dim": 2}, "head_dim 2 is too small for dynamic RoPE"),
    ({"rope_scaling": {"rope_type": ["x" * 500]}}, r'rope type \["xxxxxxxxx'),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be a positive integer, got 0"),
    ({"model_type": "mistral", "sliding_window": "4096"}, "sliding_window must be a positive integer, got '4096'"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": "28"},
     "max_window_layers must be an integer of 0 or more, got '28'"),
    ({"model_type": "qwen2", "use_sliding_window": 1}, "use_sliding_window must be true or false, got 1"),
    ({"eos_token_id": -5}, r"eos_token_id -5 is not a token id of the vocabulary \[0, 32000\)"),
    ({"eos_token_id": [2, 32000]}, r"eos_token_id 32000 is not a token id of the vocabulary \[0, 32000\)"),
    ({"bos_token_id": -1}, r"bos_token_id -1 is not a token id"),
    ({"eos_token_id": "2"}, "eos_token_id must be an integer or a list of integers, got '2'"),
    ({"layer_types": "full_attention"}, "layer_types must be a list of strings, got 'full_attention'"),
])
def test_every_field_is_checked_for_its_type_and_a_finite_sensible_range(change, message):
    with pytest.raises(InputError, match=message) as caught:
        from_hf({**BASE, **change}, "c")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


@pytest.fixture
def deadline():
    """A call that would hang (a loop over 10^9 layers) fails the test after a few seconds instead."""
    def expired(*_):
        raise TimeoutError("still running after 5 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("key", ["vocab_size", "intermediate_size", "head_dim", "hidden_size", "num_hidden_layers",
                                 "num_attention_heads", "max_position_embeddings"])
@pytest.mark.parametrize("value", [10**9, 10**12])
def test_enormous_sizes_are_one_line_before_any_shape_is_made(deadline, key, value):
    doc = {**BASE, key: value}
    if key == "num_attention_heads":
        doc["hidden_size"] = value * 16
    with pytest.raises(InputError, match=f"{key} {value} is more than .*, the largest this frontend builds"):
        weight_shapes(from_hf(doc, "c"))


def test_the_largest_published_shapes_are_within_the_maxima():
    """Llama 3.1 405B's sizes, a 262144-token vocabulary and 10M positions still read."""
    doc = {"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
           "num_key_value_heads": 8, "vocab_size": 262144, "max_position_embeddings": 10485760, "rope_theta": 500000}
    assert len(weight_shapes(from_hf(doc, "c"))) == 1 + 126 * 9 + 1
