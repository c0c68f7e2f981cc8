"""Safetensors checkpoints to hidden states: `turnip llama` and `turnip build`, outputs and one-line errors."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from turnip_cli.main import main as turnip
from turnip_ir.io import load_taskgraph
from turnip_ir.units import format_size
from frontend.safetensors import save_file, save_sharded
from frontend.workloads import llama

CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "torch_dtype": "float32"}


def checkpoint(folder, shards: int = 0, prefix: str = "model.", drop: str = "", reshape: str = "",
               relabel: tuple[str, str] = ()) -> dict:
    """A tiny HF model folder with random weights; returns the weights by their `model.` names.

    `relabel` (name, code) rewrites one float32 tensor's dtype code in the header, its bytes kept."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    weights = dict(llama.RandomWeights(llama.load_config(str(folder)), seed=11))
    stored = {prefix + name.removeprefix("model."): w for name, w in weights.items() if name != drop}
    if reshape:
        stored[reshape] = stored[reshape][:, :-1]
    if shards:
        save_sharded(stored, folder, shards)
    else:
        save_file(stored, folder / "model.safetensors")
    if relabel:
        _relabel(folder / "model.safetensors", *relabel)
    return weights


def _relabel(path, name: str, code: str) -> None:
    """Give tensor `name` the dtype `code` (the shape kept, or flat where the item size differs), its bytes kept."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    entry = header[name]
    begin, end = entry["data_offsets"]
    size = {"I32": 4, "I64": 8, "BOOL": 1}[code]
    entry["dtype"] = code
    if size != 4:
        entry["shape"] = [(end - begin) // size]
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def hidden_states(capsys, *args) -> np.ndarray:
    assert turnip(["llama", *map(str, args)]) == 0, capsys.readouterr().err
    return np.load(args[args.index("--outputs") + 1])["hidden_states"]


@pytest.mark.parametrize("shards, prefix", [(0, "model."), (3, "model."), (0, "")])
def test_checkpoint_to_hidden_states_equals_reference(tmp_path, capsys, shards, prefix):
    weights = checkpoint(tmp_path / "m", shards, prefix)
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    out = hidden_states(capsys, "--weights", tmp_path / "m", "--input-ids", tmp_path / "ids.npy", "--memory", "48KiB",
                        "--block", 6, "--order", "random", "--outputs", tmp_path / "out.npz")
    expected = llama.float64_forward(llama.load_config(str(tmp_path / "m")), weights, ids)
    assert out.shape == (20, 32) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert "offloaded" in capsys.readouterr().out


def test_random_weights_from_a_seed_are_reproducible_over_gpus(tmp_path, capsys):
    common = ["--config", "tiny-gqa", "--tokens", 40, "--memory", "1MiB", "--seed", 5]
    one = hidden_states(capsys, *common, "--outputs", tmp_path / "a.npz")
    two = hidden_states(capsys, *common, "--gpus", 2, "--placement", "heads", "--outputs", tmp_path / "b.npz", "--trace", tmp_path / "t.json")
    printed = capsys.readouterr().out
    assert f"wrote {tmp_path / 'b.npz'}" in printed and f"wrote {tmp_path / 't.json'}" in printed
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_an_output_that_is_the_input_ids_is_refused(tmp_path, capsys):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(8, dtype=np.int64))
    assert turnip(["llama", "--config", "tiny-gqa", "--input-ids", str(ids), "--memory", "1MiB", "--outputs", str(ids)]) == 1
    assert "is the input file" in capsys.readouterr().err
    assert np.load(ids).tolist() == list(range(8))


@pytest.mark.parametrize("make, args, code, message", [
    (lambda d: None, ["--weights", "{d}/absent"], 1, "weights folder '{d}/absent' does not exist"),
    (lambda d: d.mkdir(), ["--weights", "{d}"], 1, "weights folder '{d}' has no config.json"),
    (lambda d: d.mkdir() or (d / "config.json").write_text(json.dumps(CONFIG)), ["--weights", "{d}"], 1,
     "has neither model.safetensors nor model.safetensors.index.json"),
    (lambda d: checkpoint(d, drop="model.layers.1.mlp.up_proj.weight"), ["--weights", "{d}"], 1,
     "tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
    (lambda d: checkpoint(d, reshape="model.layers.0.self_attn.k_proj.weight"), ["--weights", "{d}"], 1,
     "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 31], the config needs [16, 32]"),
    (lambda d: checkpoint(d), ["--weights", "{d}", "--memory", "1KiB"], 2,
     "a budget of 1024 bytes (1.00 KiB) per GPU is too small for this prefill: it needs"),
    (lambda d: checkpoint(d, relabel=("model.layers.1.self_attn.v_proj.weight", "I32")), ["--weights", "{d}"], 1,
     "tensor 'model.layers.1.self_attn.v_proj.weight' has dtype int32, a weight must be F16, BF16, F32 or F64"),
    (lambda d: checkpoint(d, relabel=("model.norm.weight", "I64")), ["--weights", "{d}"], 1,
     "tensor 'model.norm.weight' has dtype int64, a weight must be F16, BF16, F32 or F64"),
    (lambda d: checkpoint(d, relabel=("model.norm.weight", "BOOL")), ["--weights", "{d}"], 1,
     "tensor 'model.norm.weight' in '{d}/model.safetensors': dtype 'BOOL' is not supported"),
    (lambda d: None, ["--config", "{d}/nope.json"], 1, "is neither a preset"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, make, args, code, message):
    folder = tmp_path / "m"
    make(folder)
    args = [a.format(d=folder) for a in args]
    memory = [] if "--memory" in args else ["--memory", "1MiB"]
    assert turnip(["llama", *args, "--tokens", "8", *memory]) == code
    err = capsys.readouterr().err
    assert message.format(d=folder) in err and len(err.strip().splitlines()) == 1


def test_token_ids_are_checked(tmp_path, capsys):
    np.save(tmp_path / "big.npy", np.array([1, 256]))
    np.save(tmp_path / "flat.npy", np.zeros((2, 2), dtype=np.int64))
    (tmp_path / "junk.npy").write_text("no")
    for name, message in [("big", "token id 256 in"), ("flat", "must be a non-empty 1-D integer array"),
                          ("junk", "is neither a .npy nor an .npz file; expected a .npy"), ("absent", "does not exist")]:
        assert turnip(["llama", "--config", "tiny", "--input-ids", str(tmp_path / f"{name}.npy"), "--memory", "1MiB"]) == 1
        assert message in capsys.readouterr().err


def test_a_subprocess_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "turnip_cli.main", "llama", "--config", "tiny", "--tokens", "0",
                           "--memory", "1MiB"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "turnip llama: error: --tokens must be a positive integer, got 0"


@pytest.mark.parametrize("args, nodes", [
    (["matmul"], 32),
    (["matmul", "--config", '{"m": 64, "k": 64, "n": 64}', "--block", "32", "--gpus", "2", "--placement", "round-robin"], None),
    (["ffn", "--gpus", "2", "--placement", "layers", "--tokens", "128"], None),
    (["llama", "--config", "tiny-gqa", "--gpus", "2", "--placement", "heads", "--block", "64"], None),
])
@pytest.mark.parametrize("suffix", ["json", "mlir"])
def test_build_writes_a_loadable_taskgraph(tmp_path, capsys, args, nodes, suffix):
    path = tmp_path / f"g.{suffix}"
    assert turnip(["build", *args, "-o", str(path)]) == 0
    graph = load_taskgraph(path)
    assert nodes is None or len(graph) == nodes
    assert f"wrote {path}: {len(graph)} nodes" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["matmul", "--config", '{"size": 3}'], "unknown key 'size'"),
    (["ffn", "--placement", "rings"], "unknown ffn placement 'rings'"),
    (["matmul", "--tokens", "5"], "--tokens applies to ffn and llama"),
    (["llama", "--config", "tiny", "--placement", "heads", "--gpus", "3"], "needs gpus (3) to divide the kv heads (4)"),
    (["llama", "--block", "0"], "--block must be a positive integer, got 0"),
    (["ffn", "--block", "-4"], "--block must be a positive integer, got -4"),
    (["llama", "--gpus", "0"], "--gpus must be a positive integer, got 0"),
    (["matmul", "--gpus", "0"], "--gpus must be a positive integer, got 0"),
    (["ffn", "--tokens", "0"], "--tokens must be a positive integer, got 0"),
])
def test_build_errors(tmp_path, capsys, args, message):
    assert turnip(["build", *args, "-o", str(tmp_path / "g.json")]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("placement", llama.PLACEMENTS)
def test_every_placement_runs_on_the_sim_backend_over_two_gpus(capsys, placement):
    args = ["llama", "--config", "tiny", "--tokens", "128", "--memory", "200KiB", "--gpus", "2", "--placement", placement,
            "--backend", "sim"]
    assert turnip(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "backend sim" in out and "busy: gpu0" in out and "gpu1" in out
    assert " moved 0 B" not in out  # every placement moves something between the GPUs


def test_stored_dtypes_are_converted_to_the_model_dtype(tmp_path):
    weights = checkpoint(tmp_path / "m")  # float32 config
    half = {name: w.astype(np.float16) for name, w in weights.items()}
    save_file(half, tmp_path / "m" / "model.safetensors", bfloat16=("model.norm.weight",))
    config = llama.load_config(str(tmp_path / "m"))
    loaded = llama.CheckpointWeights(tmp_path / "m", config)
    q = loaded["model.layers.0.self_attn.q_proj.weight"]
    assert q.dtype == np.float32 and np.array_equal(q, half["model.layers.0.self_attn.q_proj.weight"])
    norm = loaded["model.norm.weight"]  # stored as BF16: 8 bits of mantissa
    assert norm.dtype == np.float32 and np.allclose(norm, weights["model.norm.weight"], rtol=1e-2)


def test_the_attention_provider_is_a_cuda_option_that_other_backends_accept(tmp_path, capsys):
    common = ["--config", "tiny", "--tokens", 24, "--memory", "1MiB", "--backend", "cpu"]
    plain = hidden_states(capsys, *common, "--outputs", tmp_path / "a.npz")
    assert capsys.readouterr().err == ""
    chosen = hidden_states(capsys, *common, "--attention", "triton", "--outputs", tmp_path / "b.npz")
    np.testing.assert_array_equal(plain, chosen)
    assert capsys.readouterr().err == ("warning: --attention triton is ignored: it picks the cuda backend's attention "
                                       "provider, and the cpu backend has one\n")
    with pytest.raises(SystemExit) as exit_:
        turnip(["llama", *map(str, common), "--attention", "flash9"])
    assert exit_.value.code == 2 and "invalid choice: 'flash9'" in capsys.readouterr().err


def test_explain_prints_why_each_gpu_reloads(capsys):
    args = ["llama", "--config", "tiny", "--tokens", "128", "--memory", "100KiB", "--gpus", "2", "--backend", "sim", "--explain"]
    assert turnip(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "GPU 0: budget 100.00 KiB;" in out and "GPU 1: budget 100.00 KiB;" in out
    assert "reloads after an eviction" in out and out.index("GPU 1: budget") < out.index("backend sim")


def test_membership_reads_no_tensor(tmp_path, monkeypatch):
    """`name in weights` (as ChainMap asks in `feed`) answers from the names: no draw, no read."""
    from frontend.workloads.llama import weights as module

    checkpoint(tmp_path / "m")
    config = llama.load_config(str(tmp_path / "m"))
    drawn, read = [], []
    real_rng, real_get = module.rng, module.SafeTensors.get
    monkeypatch.setattr(module, "rng", lambda *a: drawn.append(a) or real_rng(*a))
    monkeypatch.setattr(module.SafeTensors, "get", lambda self, *a, **k: read.append(a) or real_get(self, *a, **k))
    for weights in (llama.RandomWeights(llama.load_config("7b"), seed=0), llama.CheckpointWeights(tmp_path / "m", config)):
        assert "model.embed_tokens.weight" in weights and "model.norm.weight" in weights
        assert "model.layers.0.mlp.up_proj.weight" in weights and "model.layers.99.mlp.up_proj.weight" not in weights and 3 not in weights
    assert drawn == [] and read == []
    assert llama.RandomWeights(config, seed=0)["model.norm.weight"].shape == (32,) and len(drawn) == 1  # the counter counts


@pytest.mark.parametrize("block", ["0", "-3"])
@pytest.mark.parametrize("option", ["--block", "--gpus", "--repeats"])
def test_a_non_positive_block_gpu_or_repeat_count_is_refused_not_the_default(capsys, option, block):
    assert turnip(["llama", "--config", "tiny", "--tokens", "128", "--memory", "1MiB", "--backend", "sim", option, block]) == 1
    assert capsys.readouterr().err.strip() == f"turnip llama: error: {option} must be a positive integer, got {block}"


def test_a_block_past_the_token_count_is_clamped_and_the_summary_says_so(tmp_path, capsys):
    assert turnip(["llama", "--config", "tiny", "--tokens", "128", "--memory", "1MiB", "--backend", "sim", "--block", "1000"]) == 0
    out = capsys.readouterr().out
    assert "128 tokens in blocks of 128 (--block 1000 clamped to the token count);" in out and "blocks of 1000" not in out
    for block, name in (("1000", "a.json"), ("64", "b.json")):
        assert turnip(["build", "llama", "--tokens", "64", "--block", block, "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert llama.build_llama(llama.load_config("tiny"), 64, 1000).block == 64


GiB = 1 << 30


def test_a_run_past_host_memory_is_refused_before_any_weight_is_drawn(tmp_path, capsys, monkeypatch):
    from frontend.workloads.llama import weights as module

    monkeypatch.setattr("turnip_cli.llama_cmd.available_bytes", lambda: 16 * GiB)
    real_rng = module.rng

    def rng(seed, name):
        assert name == "input_ids", f"drew weight '{name}' before the host memory check"
        return real_rng(seed, name)

    monkeypatch.setattr(module, "rng", rng)
    (tmp_path / "huge.json").write_text(json.dumps({**CONFIG, "vocab_size": 2**24, "hidden_size": 8192}))  # within MAXIMA
    assert turnip(["llama", "--config", str(tmp_path / "huge.json"), "--input-ids", str(_ids(tmp_path)), "--memory", "1MiB",
                   "--backend", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    footprint = llama.host_footprint(llama.load_config(str(tmp_path / "huge.json")), 3)
    need = footprint.total + (1 << 20)
    assert need > 2**24 * 8192 * 4  # the embedding table alone is 512 GiB
    assert err == (f"turnip llama: error: host memory: the run needs {need} bytes (weights {format_size(footprint.weights)}, "
                   f"activations of 3 tokens {format_size(footprint.activations)}, cpu arenas 1.00 MiB) but {16 * GiB} "
                   "bytes (16.00 GiB) are available")
    monkeypatch.setattr("turnip_cli.llama_cmd.available_bytes", lambda: 8 * GiB)
    assert turnip(["llama", "--config", "7b", "--tokens", "32768", "--memory", "4GiB", "--backend", "cpu",
                   "--attention", "triton"]) == 1
    out = capsys.readouterr()
    need = llama.host_footprint(llama.load_config("7b"), 32768).total + 4 * GiB
    assert f"needs {need} bytes (weights 12.31 GiB, activations of 32768 tokens 3.36 GiB, cpu arenas 4.00 GiB)" in out.err
    assert out.err.startswith("warning: --attention triton is ignored") and len(out.err.splitlines()) == 2
    assert turnip(["llama", "--config", "tiny", "--tokens", str(2**24), "--memory", "1MiB", "--backend", "cpu"]) == 1
    assert "activations of 16777216 tokens" in capsys.readouterr().err  # refused before 2^24 ids are drawn


def _ids(tmp_path):
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3]))
    return tmp_path / "ids.npy"


def test_host_memory_counts_weights_activations_and_cpu_arenas_but_not_on_sim(capsys, monkeypatch):
    config = llama.load_config("tiny")
    footprint = llama.host_footprint(config, 64)
    weights = llama.RandomWeights(config, 0)
    assert footprint.weights == sum(weights[name].nbytes for name in llama.weight_shapes(config))  # what the prefill reads
    assert footprint.activations == 64 * (2 * 64 + 2 * 16 + 2 * 64 + 4 * 64 + 2 * 128) * 4
    args = ["llama", "--config", "tiny", "--tokens", "64", "--memory", "1MiB"]
    need = footprint.total + min(2 << 20, footprint.total)  # the arenas take at most the budget and what the tensors take
    for available, backend, code in [(need, "cpu", 0), (need - 1, "cpu", 1), (1, "sim", 0)]:
        monkeypatch.setattr("turnip_cli.llama_cmd.available_bytes", lambda: available)
        assert turnip([*args, "--backend", backend, "--gpus", "2"]) == code, capsys.readouterr().err
        assert ("host memory" in capsys.readouterr().err) == (code == 1)


def test_float16_on_the_cpu_backend_is_multiplied_in_float32_and_the_summary_and_help_say_so(capsys):
    from runtime.kernels_numpy import NUMPY_KERNELS

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 512)).astype(np.float16), rng.standard_normal((128, 512)).astype(np.float16)
    out = np.empty((64, 128), np.float16)
    NUMPY_KERNELS["einsum"]([x, w], out, {"equation": "ti,oi->to"})
    np.testing.assert_array_equal(out, np.einsum("ti,oi->to", x.astype(np.float32), w.astype(np.float32), optimize=True)
                                  .astype(np.float16))  # one rounding, of the float32 product
    NUMPY_KERNELS["matmul"]([x, w.T], out, {})
    np.testing.assert_array_equal(out, (x.astype(np.float32) @ w.T.astype(np.float32)).astype(np.float16))
    args = ["llama", "--config", "tiny", "--tokens", "16", "--memory", "1MiB", "--dtype", "float16"]
    assert turnip([*args, "--backend", "cpu"]) == 0
    assert "per GPU; float16 matmuls computed in float32 on the cpu backend, rounded to float16\n" in capsys.readouterr().out
    assert turnip([*args, "--backend", "sim"]) == 0
    assert "float32" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        turnip(["llama", "--help"])
    assert "computes float16 matmuls in float32" in " ".join(capsys.readouterr().out.split())


def bfloat16_checkpoint(folder, big: float = 0.0) -> dict:
    """A tiny bfloat16 model folder (every tensor BF16); `big` is written into one weight when given.
    Returns the weights as stored, in float32 (exactly their bfloat16 values)."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}))
    weights = dict(llama.RandomWeights(llama.load_config(str(folder)), seed=11))  # bfloat16 arrays
    stored = {name: np.asarray(w, np.float32) for name, w in weights.items()}
    if big:
        stored["model.layers.1.mlp.up_proj.weight"][0, 0] = big
    save_file(stored, folder / "model.safetensors", bfloat16=tuple(stored))
    return {name: w.astype(np.float32).astype(llama.load_config(str(folder)).dtype).astype(np.float32) for name, w in stored.items()}


def test_a_bfloat16_checkpoint_computes_in_float32_on_the_cpu_backend_and_says_so(tmp_path, capsys):
    weights = bfloat16_checkpoint(tmp_path / "m")
    ids = np.arange(12, dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    common = ["--weights", tmp_path / "m", "--input-ids", tmp_path / "ids.npy", "--memory", "48KiB", "--backend", "cpu"]
    for dtype in ([], ["--dtype", "bfloat16"]):
        out = hidden_states(capsys, *common, *dtype, "--outputs", tmp_path / "out.npz")
        assert ", float32; 12 tokens" in capsys.readouterr().out
        assert out.dtype == np.float32
        expected = llama.float64_forward(llama.load_config(str(tmp_path / "m")), weights, ids)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert turnip(["llama", *map(str, common)]) == 0
    assert "per GPU; bfloat16 computed in float32 on the cpu backend\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        turnip(["llama", "--help"])
    assert "bfloat16 is computed in float32 on the cpu backend" in " ".join(capsys.readouterr().out.split())


def test_a_bfloat16_checkpoint_costs_two_byte_tensors_on_the_sim_backend(tmp_path, capsys):
    bfloat16_checkpoint(tmp_path / "m")
    args = ["llama", "--weights", str(tmp_path / "m"), "--tokens", "16", "--memory", "1MiB", "--backend", "sim"]
    assert turnip(args) == 0
    out = capsys.readouterr().out
    assert ", bfloat16; 16 tokens" in out and "computed in float32" not in out


def test_a_bfloat16_checkpoint_in_float16_that_overflows_names_the_tensor(tmp_path, capsys):
    bfloat16_checkpoint(tmp_path / "m", big=1e6)
    args = ["llama", "--weights", str(tmp_path / "m"), "--tokens", "8", "--memory", "1MiB", "--backend", "cpu"]
    assert turnip([*args, "--dtype", "float16"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "tensor 'model.layers.1.mlp.up_proj.weight'" in err and "overflow float16 (largest 65504)" in err
    assert turnip(args) == 0  # in float32 (the cpu backend's bfloat16) the same weights are fine


@pytest.mark.skipif("not __import__('runtime.backends.cuda', fromlist=['simulated']).simulated()")
def test_a_bfloat16_checkpoint_runs_in_bfloat16_on_the_cuda_backend(tmp_path, capsys):
    """The default on cuda (here numba's simulator) is the checkpoint's own bfloat16; outputs come back as
    float32 holding bfloat16 values, within bfloat16's tolerance of the float64 forward."""
    weights = bfloat16_checkpoint(tmp_path / "m")
    ids = np.arange(8, dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    out = hidden_states(capsys, "--weights", tmp_path / "m", "--input-ids", tmp_path / "ids.npy", "--memory", "96MiB",
                        "--backend", "cuda", "--outputs", tmp_path / "out.npz")
    assert ", bfloat16; 8 tokens" in capsys.readouterr().out
    assert out.dtype == np.float32 and np.array_equal(out, out.astype(llama.load_config(str(tmp_path / "m")).dtype).astype(np.float32))
    expected = llama.float64_forward(llama.load_config(str(tmp_path / "m")), weights, ids)
    assert np.max(np.abs(out - expected)) / np.max(np.abs(expected)) < 5e-2


@pytest.mark.parametrize("backend, wanted, computed", [("cpu", None, "float32"), ("cpu", "bfloat16", "float32"),
                                                        ("sim", None, "bfloat16"), ("sim", "float16", "float16")])
def test_a_session_on_a_bfloat16_model_computes_in_the_backends_dtype(tmp_path, backend, wanted, computed):
    from turnip import Session

    bfloat16_checkpoint(tmp_path / "m")
    session = Session(weights=str(tmp_path / "m"), memory=1 << 20, backend=backend, dtype=wanted)
    assert session.config.dtype == computed


def test_block_auto_keeps_the_block_the_sim_predicts_fastest_and_skips_one_that_does_not_fit(monkeypatch):
    from turnip import choose, search
    from turnip_ir.errors import BudgetError

    config, built = llama.load_config("tiny"), {}
    predicted = {32: 3.0, 64: 1.0, 128: 2.0}
    build = choose.LlamaPrefill.build
    monkeypatch.setattr(choose.LlamaPrefill, "build", lambda self, c: (built.__setitem__("last", c.block), build(self, c))[1])
    monkeypatch.setattr(search, "sim_makespan", lambda memgraph, streams, cost, deadline, compiled: predicted[built["last"]])
    given = {"block": "auto", "layer_order": "blocks", "query_group": 1, "schedule": "given"}
    prefill, target = choose.LlamaPrefill(config, 128), choose.PlanTarget(1 << 30)
    chosen = choose.choose_llama_plan(prefill, target, given)
    scores = {block: outcome.score for block, outcome in chosen.steps[0].outcomes.items()}
    assert chosen.candidate.block == 64 and chosen.built.block == 64 and scores == predicted
    assert len(chosen.memgraph) == len(chosen.built.graph)  # the plan of the chosen block (nothing offloaded at 1 GiB)
    predicted[128] = 0.5  # the fastest, but it does not fit
    small = lambda self, graph: 1 << 30 if len(graph) > 60 else 256  # noqa: E731 (the one-block graph cannot fit)
    monkeypatch.setattr(choose.PlanTarget, "arena_of", small)
    chosen = choose.choose_llama_plan(prefill, target, given)
    assert chosen.candidate.block == 64 and chosen.steps[0].outcomes[128].kind == "no fit"
    assert chosen.memgraph.budget == 1 << 30
    monkeypatch.setattr(choose.PlanTarget, "arena_of", lambda self, graph: 256)
    with pytest.raises(BudgetError):
        choose.choose_llama_plan(prefill, target, given)


def test_block_candidates_are_clamped_to_the_token_count():
    from turnip.choose import block_candidates

    assert block_candidates(131072) == [1024, 2048, 4096, 8192]
    assert block_candidates(3000) == [750, 1024, 1500, 2048, 3000]
    assert block_candidates(256) == [64, 128, 256]


def test_block_auto_with_schedule_auto_end_to_end_on_cpu_equals_the_reference(tmp_path, capsys):
    out = hidden_states(capsys, "--config", "tiny", "--tokens", 256, "--memory", "256KiB", "--backend", "cpu", "--seed", 3,
                        "--block", "auto", "--schedule", "auto", "--outputs", tmp_path / "out.npz")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("block auto: ") and "256 does not fit" in lines[0]
    assert lines[1].startswith("schedule auto: ") and all(f"{name} " in lines[1] for name in ("given", "dfs", "memory"))
    block = int(lines[0].split()[2])
    assert lines[2].startswith("plan chosen in ") and f"blocks of {block}," in lines[2]
    assert f"256 tokens in blocks of {block};" in lines[3]
    config = llama.load_config("tiny")
    weights, ids = llama.RandomWeights(config, seed=3), llama.random_ids(config, 256, 3)
    expected = llama.float64_forward(config, dict(weights), ids)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_every_auto_choice_in_turn_end_to_end_on_cpu_equals_the_reference(tmp_path, capsys):
    out = hidden_states(capsys, "--config", "tiny", "--tokens", 256, "--memory", "256KiB", "--backend", "cpu", "--seed", 3,
                        "--block", "auto", "--layer-order", "auto", "--query-group", "auto", "--schedule", "auto",
                        "--outputs", tmp_path / "out.npz")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["layer order auto", "block auto", "query group auto", "schedule auto"]
    order, block, group = lines[0].split()[3], int(lines[1].split()[2]), int(lines[2].split()[3])
    assert "blocks " in lines[0] and "halves " in lines[0]
    assert lines[2].count(" ms") == len([g for g in (1, 2, 4, 8) if g <= 256 // block])  # groups up to the block count
    assert lines[4].startswith("plan chosen in ") and f"layers in {order}, blocks of {block}, query groups of {group}" in lines[4]
    assert f"256 tokens in blocks of {block}" in lines[5] and (order == "blocks") == ("layers in halves" not in lines[5])
    assert (group > 1) == (f"query groups of {group}" in lines[5])
    config = llama.load_config("tiny")
    weights, ids = llama.RandomWeights(config, seed=3), llama.random_ids(config, 256, 3)
    expected = llama.float64_forward(config, dict(weights), ids)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_layer_order_and_query_group_given_are_built_as_given(capsys):
    assert turnip(["llama", "--config", "tiny", "--tokens", "128", "--memory", "1MiB", "--backend", "sim", "--block", "32",
                   "--layer-order", "halves", "--query-group", "2"]) == 0
    assert "128 tokens in blocks of 32, layers in halves, query groups of 2;" in capsys.readouterr().out
    assert turnip(["llama", "--config", "tiny", "--tokens", "128", "--memory", "1MiB", "--backend", "sim", "--query-group", "0"]) == 1
    assert capsys.readouterr().err.strip().endswith("--query-group must be a positive integer, got 0")


def test_build_block_auto_needs_memory_and_applies_to_llama_only(tmp_path, capsys):
    assert turnip(["build", "llama", "--tokens", "256", "--block", "auto", "--memory", "256KiB", "-o", str(tmp_path / "g.json")]) == 0
    assert capsys.readouterr().out.startswith("block auto: 128 (sim predictions: 64 ")
    assert load_taskgraph(str(tmp_path / "g.json")) is not None
    assert turnip(["build", "llama", "--block", "auto", "-o", str(tmp_path / "h.json")]) == 1
    assert "--memory goes with --block, --layer-order or --query-group auto" in capsys.readouterr().err
    assert turnip(["build", "ffn", "--block", "auto", "--memory", "1MiB", "-o", str(tmp_path / "h.json")]) == 1
    assert "--block auto applies to llama, not ffn" in capsys.readouterr().err
    assert turnip(["build", "ffn", "--layer-order", "halves", "-o", str(tmp_path / "h.json")]) == 1
    assert "--layer-order halves applies to llama, not ffn" in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_repeats_run_the_plan_again_on_one_prepared_backend(tmp_path, capsys, backend):
    """--repeats N: every run's makespan on one line, the phases counted once, and (where values are
    computed) the last run's outputs equal a single run's."""
    common = ["--config", "tiny", "--tokens", 64, "--memory", "256KiB", "--backend", backend]
    outputs = {} if backend == "sim" else {"--outputs": tmp_path / "three.npz"}
    assert turnip(["llama", *map(str, common), "--repeats", "3", *[str(x) for pair in outputs.items() for x in pair]]) == 0
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if line.startswith("repeats: ")]
    spans = [float(x) for x in line.split("makespans ")[1].split(" ms")[0].split(", ")]
    assert len(spans) == 3 and all(s > 0 for s in spans) and f"(median {sorted(spans)[1]:.3f} ms)" in line
    assert "run " in printed and "(3 runs)" in printed
    if backend == "sim":
        assert len(set(spans)) == 1  # a virtual clock: the same plan takes the same time
        return
    once = hidden_states(capsys, *common, "--outputs", tmp_path / "one.npz")
    np.testing.assert_array_equal(np.load(tmp_path / "three.npz")["hidden_states"], once)


def test_with_no_flags_the_sim_backend_chooses_the_plan_and_the_cpu_backend_keeps_the_defaults(capsys):
    common = ["llama", "--config", "tiny", "--tokens", "256", "--memory", "256KiB"]
    assert turnip([*common, "--backend", "sim"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["layer order auto", "block auto", "query group auto", "schedule auto"]
    assert lines[4].startswith("plan chosen in ") and "256 tokens in blocks of 128, layers in halves;" in lines[5]
    assert turnip([*common, "--backend", "sim", "--block", "32"]) == 0
    out = capsys.readouterr().out
    assert "block auto:" not in out and "layer order auto:" in out and "256 tokens in blocks of 32" in out
    assert turnip([*common, "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "auto:" not in out and not any(line.startswith("plan") for line in out.splitlines())
    assert "256 tokens in blocks of 64;" in out
