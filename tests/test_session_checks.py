"""The Python API's edges (issue 47): temperatures too small to divide by, NaN or inf weights and logits,
two threads on one session, and wrong arguments, each a one-line `InputError` (or a documented warning),
never a hang, a silent wrong token or another exception."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import turnip.inputs
from frontend.workloads import llama
from turnip import Session
from turnip.inputs import holds_nonfinite
from turnip.sampling import next_tokens
from turnip_ir.errors import InputError, KernelError

PROMPTS = [np.array([1, 2, 3]), np.array([4, 5])]


# ----- temperatures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300, 1e-30])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature, dtype):
    logits = np.array([[0.5, 3.0, -2.0, 1.0, 2.0], [-1.0, -3.0, 0.0, 4.0, 3.999]], dtype=dtype)
    rng = np.random.default_rng(0)
    for _ in range(10):
        assert next_tokens(logits, temperature, 1.0, rng).tolist() == [1, 3]


def test_a_session_at_temperature_1e_320_gives_the_greedy_tokens():
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        greedy = session.generate(PROMPTS, 4).tokens
        tiny = session.generate(PROMPTS, 4, temperature=1e-320, seed=3).tokens
    np.testing.assert_array_equal(tiny, greedy)


# ----- one call at a time ------------------------------------------------------------------------------
def test_a_second_thread_calling_generate_meanwhile_gets_a_clear_error_at_once(monkeypatch):
    """Thread A's generate is held inside its first run until thread B has tried its own call."""
    inside, tried = threading.Event(), threading.Event()
    results: dict[str, object] = {}
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        greedy = session.generate(PROMPTS, 3).tokens
        run = Session._run

        def held(self, *args, **kwargs):
            if threading.current_thread().name == "A" and not inside.is_set():
                inside.set()
                tried.wait(20)
            return run(self, *args, **kwargs)

        monkeypatch.setattr(Session, "_run", held)

        def call(name):
            try:
                results[name] = session.generate(PROMPTS, 3).tokens
            except Exception as err:  # what the caller sees
                results[name] = err
            finally:
                if name == "B":
                    tried.set()

        a = threading.Thread(target=call, args=("A",), name="A")
        a.start()
        assert inside.wait(20)
        began = time.perf_counter()
        b = threading.Thread(target=call, args=("B",), name="B")
        b.start()
        b.join(20)
        a.join(20)
        assert not a.is_alive() and not b.is_alive()
        assert isinstance(results["B"], InputError) and "one call at a time" in str(results["B"])
        assert "\n" not in str(results["B"]) and time.perf_counter() - began < 5
        np.testing.assert_array_equal(results["A"], greedy)
        np.testing.assert_array_equal(session.generate(PROMPTS, 3).tokens, greedy)  # usable after


def test_threads_hammering_one_session_never_hang_and_every_call_that_runs_is_right():
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        greedy = session.generate(PROMPTS, 2).tokens
        outcomes: list[object] = []

        def calls():
            for _ in range(4):
                try:
                    outcomes.append(session.generate(PROMPTS, 2).tokens)
                except InputError as err:
                    outcomes.append(err)

        threads = [threading.Thread(target=calls) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    assert len(outcomes) == 12
    for outcome in outcomes:
        if isinstance(outcome, InputError):
            assert "one call at a time" in str(outcome)
        else:
            np.testing.assert_array_equal(outcome, greedy)


# ----- NaN and inf in the weights and the logits -------------------------------------------------------
def _tiny_weights(dtype=None):
    config = llama.load_config("tiny")
    return {name: np.array(value) for name, value in llama.RandomWeights(config, 0).items()}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["lm_head.weight", "model.layers.1.mlp.down_proj.weight", "model.embed_tokens.weight"])
def test_a_weight_holding_nan_or_inf_is_refused_naming_it(name, bad):
    weights = _tiny_weights()
    weights[name][3, 2] = bad
    with Session(config="tiny", weights=weights, memory=1 << 20, backend="cpu") as session:
        with pytest.raises(InputError) as caught:
            session.generate(PROMPTS, 2)
    message = str(caught.value)
    assert f"'{name}'" in message and "[3, 2]" in message and "\n" not in message


def test_a_refused_weight_is_refused_again_at_the_next_call_and_by_prefill():
    """The check runs on a thread of its own while the run goes on; what it refused is not kept as checked."""
    weights = _tiny_weights()
    weights["model.layers.0.mlp.up_proj.weight"][1, 1] = np.nan
    with Session(config="tiny", weights=weights, memory=1 << 20, backend="cpu") as session:
        for call in (lambda: session.generate(PROMPTS, 2), lambda: session.generate(PROMPTS, 2), lambda: session.prefill(PROMPTS[0])):
            with pytest.raises(InputError, match="up_proj.weight"):
                call()


def test_a_weight_beyond_float16s_range_is_refused_in_a_float16_session():
    weights = _tiny_weights()
    weights["model.layers.0.self_attn.o_proj.weight"][0, 0] = 1e6  # finite in float32, inf in float16
    with Session(config="tiny", weights=weights, memory=1 << 20, backend="cpu", dtype="float16") as session:
        with pytest.raises(InputError, match="o_proj.weight.*float16"):
            session.generate(PROMPTS, 2)


def test_finite_weights_pass_and_the_check_reads_each_tensor_once(monkeypatch):
    import turnip.session

    checked = []
    check = turnip.session.check_finite_weight
    monkeypatch.setattr(turnip.session, "check_finite_weight", lambda name, values: (checked.append(name), check(name, values)))
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        session.generate(PROMPTS, 2)
        session.generate(PROMPTS, 2)
    assert checked and len(checked) == len(set(checked))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_holds_nonfinite_on_the_bits_of_every_float_type(dtype, monkeypatch):
    import ml_dtypes

    kind = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    monkeypatch.setattr(turnip.inputs, "CHECK_CHUNK", 64)  # the threaded chunks too
    values = np.linspace(-60000, 60000, 1001).astype(kind)
    values[[0, 500]] = [np.finfo(np.float16).max, -0.0]
    assert not holds_nonfinite(values) and not holds_nonfinite(values[::3])
    for bad in (np.nan, -np.nan, np.inf, -np.inf):
        spoiled = values.copy()
        spoiled[777] = bad
        assert holds_nonfinite(spoiled) and holds_nonfinite(spoiled.reshape(7, 11, 13))
        assert holds_nonfinite(spoiled, nan_only=True) == bool(np.isnan(bad))
    assert not holds_nonfinite(np.arange(10)) and not holds_nonfinite(np.empty(0, kind))


def test_logits_holding_nan_are_one_line_not_tokens():
    """Finite weights whose products overflow float32: inf - inf in the LM head's sums."""
    weights = _tiny_weights()
    weights["model.norm.weight"][:] = 1e20
    weights["lm_head.weight"][:] = 1e20 * np.sign(weights["lm_head.weight"])
    with Session(config="tiny", weights=weights, memory=1 << 20, backend="cpu") as session:
        with pytest.raises(KernelError) as caught:
            session.generate(PROMPTS, 2)
    assert "logits" in str(caught.value) and "NaN" in str(caught.value) and "\n" not in str(caught.value)


# ----- arguments: one InputError line, at construction or at the call ---------------------------------
def _weights_without(name):
    weights = _tiny_weights()
    weights.pop(name)
    return weights


def _weights_with(name, value):
    weights = _tiny_weights()
    weights[name] = value
    return weights


BAD_SESSIONS = {
    "dtype-int8": (dict(dtype="int8"), "dtype 'int8'"),
    "dtype-a-numpy-type": (dict(dtype=np.float16), "dtype"),
    "kv_block-0": (dict(kv_block=0), "kv_block must be a positive integer"),
    "kv_block-negative": (dict(kv_block=-16), "kv_block"),
    "kv_block-float": (dict(kv_block=16.0), "kv_block"),
    "gpus-string": (dict(gpus="2"), "gpus must be a positive integer"),
    "gpus-100000": (dict(gpus=100000), "more than the model's 2 layers"),
    "seed-negative": (dict(seed=-1), "seed must be an integer >= 0"),
    "seed-string": (dict(seed="x"), "seed"),
    "memory-float": (dict(memory=1.5), "memory must be a positive number of bytes"),
    "memory-past-2**62": (dict(memory=1 << 70), "memory"),
    "order": (dict(order="best"), "unknown order 'best'"),
    "schedule": (dict(schedule="fastest"), "unknown schedule 'fastest'"),
    "prefill-plan-name": (dict(prefill_plan="best"), "prefill_plan must be 'auto', 'default' or a mapping"),
    "prefill-plan-dimension": (dict(prefill_plan={"blocks": 64}), "prefill_plan: unknown dimension 'blocks'"),
    "prefill-plan-block": (dict(prefill_plan={"block": 0}), "prefill_plan: block must be auto or a positive integer, got 0"),
    "prefill-plan-group": (dict(prefill_plan={"query_group": 2.0}), "query_group must be auto or a positive integer"),
    "prefill-plan-order": (dict(prefill_plan={"layer_order": "rows"}), "layer_order must be auto or blocks, halves"),
    "prefill-plan-schedule": (dict(prefill_plan={"schedule": "fast"}), "schedule must be auto or given"),
    "backend-options-list": (dict(backend_options=[1]), "backend_options must be a mapping"),
    "plan-dir-int": (dict(plan_dir=3), "plan_dir must be a folder's path"),
    "config-int": (dict(config=3), "config must be a LlamaConfig"),
    "weights-int": (dict(weights=5), "weights must be a mapping"),
    "weights-incomplete": (dict(weights=_weights_without("model.layers.1.mlp.up_proj.weight")), "no 'model.layers.1.mlp.up_proj.weight'"),
    "weights-wrong-shape": (dict(weights=_weights_with("model.norm.weight", np.ones(3, np.float32))), "shape [3], the config needs [64]"),
    "weights-strings": (dict(weights=_weights_with("model.norm.weight", "abc")), "real numbers"),
    "weights-complex": (dict(weights=_weights_with("model.norm.weight", np.ones(64, np.complex64))), "real numbers"),
}


@pytest.mark.parametrize("case", BAD_SESSIONS)
def test_a_bad_session_argument_is_one_input_error_at_construction(case, tmp_path):
    given, words = BAD_SESSIONS[case]
    arguments = {"config": "tiny", "memory": 1 << 20, "backend": "cpu", "plan_dir": tmp_path / "plans", **given}
    with pytest.raises(InputError) as caught:
        Session(**arguments)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "plans").exists()  # refused before any work


BAD_CALLS = {
    "prompts-int": (dict(prompts=5), "prompts must be a list"),
    "prompts-none": (dict(prompts=None), "prompts must be a list"),
    "temperature-string": (dict(temperature="0.5"), "temperature must be a number"),
    "temperature-none": (dict(temperature=None), "temperature"),
    "top-p-string": (dict(top_p="x"), "top_p must be in (0, 1]"),
    "seed-negative": (dict(seed=-1), "seed must be an integer >= 0"),
    "seed-float": (dict(seed=1.5), "seed"),
    "stop-at-eos-string": (dict(stop_at_eos="no"), "stop_at_eos must be True or False"),
    "caches-int": (dict(caches=5), "caches must be a list"),
    "caches-none-inside": (dict(caches=[None, None]), "its cache must hold"),
    "caches-strings": (dict(caches=[[(np.full((2, 64), "a"), np.zeros((2, 64)))] * 2, [(np.zeros((1, 64)),) * 2] * 2]), "real numbers"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_a_bad_generate_argument_is_one_input_error(case):
    given, words = BAD_CALLS[case]
    arguments = {"prompts": PROMPTS, "max_new_tokens": 2, **given}
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        with pytest.raises(InputError) as caught:
            session.generate(**arguments)
        assert words in str(caught.value) and "\n" not in str(caught.value)
        assert session.generate(PROMPTS, 1).tokens.shape == (2, 1)  # still usable


def test_numpy_integers_and_paths_are_arguments_too(tmp_path):
    with Session(config="tiny", memory=np.int64(1 << 20), backend="cpu", gpus=np.int64(1), kv_block=np.int64(16), seed=np.uint8(3),
                 plan_dir=tmp_path) as session:
        tokens = session.generate(PROMPTS, np.int32(2), temperature=np.float32(0.7), seed=np.int64(4)).tokens
    assert tokens.shape == (2, 2)


# ----- --stop-at-eos without an end id ----------------------------------------------------------------
def test_stop_at_eos_without_an_end_id_says_so_in_one_line(capsys):
    from turnip_cli.main import main

    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        assert not session.config.eos_token_id
        with pytest.raises(InputError, match="needs an end-of-sequence id"):
            session.generate(PROMPTS, 2, stop_at_eos=True)
    code = main(["generate", "--config", "tiny", "--prompt-tokens", "3", "--max-new-tokens", "2", "--memory", "1MiB",
                 "--backend", "cpu", "--stop-at-eos"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "--stop-at-eos" in err and "end-of-sequence id" in err


def test_turnip_generate_refuses_a_checkpoint_with_a_nan_in_one_line(tmp_path, capsys):
    from frontend.safetensors import save_file
    from turnip_cli.main import main

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(__import__("json").dumps({**llama.PRESETS["tiny"], "model_type": "llama"}))
    weights = _tiny_weights()
    weights["lm_head.weight"][5, 7] = np.nan
    save_file(weights, folder / "model.safetensors")
    code = main(["generate", "--weights", str(folder), "--prompt-tokens", "4", "--max-new-tokens", "2", "--memory", "1MiB",
                 "--backend", "cpu", "--outputs", str(tmp_path / "gen.npz")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "'lm_head.weight'" in err and "[5, 7]" in err
    assert not (tmp_path / "gen.npz").exists()


def test_enormous_counts_are_one_line_before_anything_is_allocated():
    """A cache column of 10^9 rows or 10^12 new tokens would be a MemoryError (or hours) later."""
    from turnip import InputError, Session

    with pytest.raises(InputError, match="^kv_block must be at most"):
        Session(config="tiny", memory=1 << 20, backend="cpu", kv_block=10**9)
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        with pytest.raises(InputError, match="^max_new_tokens must be at most"):
            session.generate([1, 2, 3], 10**12)
