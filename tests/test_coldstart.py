"""Cold start: weights go from a checkpoint (or a seed) into the backend's host storage once.

A checkpoint of a few hundred MB is written with our own safetensors writer, then a fresh process
compiles the prefill, resets its peak resident memory (/proc/self/clear_refs) and puts the weights in
place: the cpu backend's whole run, and the cuda backend's `prepare` under the simulator (its kernels
would take minutes there). Peak growth must stay within 1.2x the weight bytes: reading through numpy
views of the map and copying would hold every weight twice (the mapped pages count as resident), and so
would drawing a random tensor whole before copying it. The lazy blocks themselves are checked against
the arrays they stand for, for every placement's cuts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from frontend.safetensors import save_file
from frontend.workloads import llama
from runtime import execute
from runtime.inputs import mapped, materialize

ROOT = Path(__file__).resolve().parent.parent
CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
          "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 64, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "torch_dtype": "float16"}
"""About 300 MB of float16 weights in the 12 layers; few tokens, so the run itself is cheap."""

MEASURE = r"""
import json, sys, time
from runtime import execute
from runtime.backends.cuda import CudaBackend
from runtime.graph import build_exec_graph
from passes.pipeline import compile_taskgraph
from frontend.workloads import llama

folder, CASES = sys.argv[1], json.loads(sys.argv[2])
config = llama.load_config(folder)
ids = llama.random_ids(config, 16, 0)
built = llama.build_llama(config, 16, 16)
memgraph = compile_taskgraph(built.graph, 32 << 20)
loaded = sum(node.nbytes for node in memgraph.nodes if node.op == "input")


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


measured = {}
for backend, source in CASES:
    weights = llama.CheckpointWeights(folder, config) if source == "checkpoint" else llama.RandomWeights(config, 0)
    inputs = built.feed(weights, ids)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the resident memory now
    before = status("VmRSS")
    began = time.perf_counter()
    if backend == "cpu":
        execute(memgraph, backend="cpu", inputs=inputs, verify=False)
    else:
        machine = CudaBackend()
        machine.prepare(build_exec_graph(memgraph), inputs)
        machine.close()
    measured[f"{backend}-{source}"] = {"growth": status("VmHWM") - before, "loaded": loaded, "seconds": time.perf_counter() - began}
    del weights, inputs
print(json.dumps(measured))
"""
CASES = [("cpu", "checkpoint"), ("cuda", "checkpoint"), ("cpu", "random")]


@pytest.fixture(scope="module")
def peaks(tmp_path_factory) -> dict:
    """Per case, the peak growth of resident memory while the weights were put in place, in one fresh process."""
    folder = tmp_path_factory.mktemp("coldstart")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    weights = llama.RandomWeights(llama.load_config(str(folder)), seed=1)
    save_file({name: weights[name] for name in llama.weight_shapes(weights.config)}, folder / "model.safetensors")
    del weights
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(folder), json.dumps(CASES)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # one process of about 10 s for the three cases
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("backend, source", CASES)
def test_weights_are_held_once_on_the_host(peaks, backend, source) -> None:
    measured = peaks[f"{backend}-{source}"]
    assert measured["loaded"] > 250e6  # the weights of the layers: the embedding table is read on the host only
    assert measured["growth"] <= 1.2 * measured["loaded"], measured


def _checkpoint(folder: Path, config: dict, stored_dtype: str = "float32") -> llama.LlamaConfig:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": stored_dtype}))
    weights = llama.RandomWeights(llama.load_config(str(folder)), seed=4)
    save_file(dict(weights), folder / "model.safetensors")  # bfloat16 arrays are stored as BF16
    return llama.load_config(str(folder))


SMALL = {**CONFIG, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}


@pytest.mark.parametrize("placement", llama.PLACEMENTS)
@pytest.mark.parametrize("stored, computed", [("float32", "float32"), ("float32", "float16"), ("bfloat16", "float32")])
def test_lazy_blocks_hold_what_the_arrays_hold(tmp_path, placement, stored, computed) -> None:
    """Every placement's cuts of a checkpoint and of random weights, converted or not: the lazy block
    written into a buffer equals the block cut from the whole array."""
    from dataclasses import replace

    config = replace(_checkpoint(tmp_path / "m", SMALL, stored), dtype=computed)
    built = llama.build_llama(config, 12, 4, gpus=2, placement=placement)
    ids = llama.random_ids(config, 12, 0)
    for weights in (llama.CheckpointWeights(tmp_path / "m", config), llama.RandomWeights(config, 7)):
        lazy = built.feed(weights, ids)
        eager = built.feed(dict(weights), ids)
        assert lazy.keys() == eager.keys()
        assert any(not isinstance(value, np.ndarray) for value in lazy.values())
        for key, array in eager.items():
            got = materialize(lazy[key])
            assert got.dtype == array.dtype and got.shape == array.shape, key
            np.testing.assert_array_equal(got, array, err_msg=key)


def test_random_weights_repeat_no_row() -> None:
    """The pool is a prime number of values, so rows of a 7B-wide matrix start at distinct offsets of it."""
    config = llama.load_config("7b")
    table = llama.RandomWeights(config, 0).lazy("model.embed_tokens.weight")[0:300]
    rows = materialize(table)
    assert len({row.tobytes() for row in rows}) == 300


def test_a_bfloat16_weight_that_overflows_float16_is_one_line_naming_it(tmp_path) -> None:
    """Read into float16 host storage as the run is prepared, a value past float16's range is an error
    naming the tensor, not infinities in the weights (and never a traceback)."""
    config = _checkpoint(tmp_path / "m", {**SMALL, "hidden_size": 32, "intermediate_size": 64}, "bfloat16")
    weights = dict(llama.RandomWeights(config, seed=4))
    big = "model.layers.1.mlp.up_proj.weight"
    weights[big] = weights[big].copy()
    weights[big][3, 5] = 1e5
    save_file(weights, tmp_path / "m" / "model.safetensors")
    done = subprocess.run([sys.executable, "-m", "turnip_cli.main", "llama", "--weights", str(tmp_path / "m"), "--tokens", "8",
                           "--memory", "1MiB", "--backend", "cpu", "--dtype", "float16"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"turnip llama: error: tensor '{big}' in '{tmp_path / 'm' / 'model.safetensors'}': values up to 9.984e+04 overflow "
        "float16 (largest 65504); run it in bfloat16 or float32 (--dtype)"]


def test_plans_are_built_once_per_shape_under_the_simulator() -> None:
    """A prefill's attention vertices and GEMMs share plans by shape: the cuda backend (numba's simulator)
    builds one attention plan per distinct block shape and one GEMM plan per distinct einsum shape."""
    from passes.pipeline import compile_taskgraph
    from runtime.backends.cuda import CudaBackend, simulated
    from runtime.graph import build_exec_graph

    if not simulated():
        pytest.skip("counts builds under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
    config = llama.load_config("tiny")
    built = llama.build_llama(config, 16, 4)
    memgraph = compile_taskgraph(built.graph, 1 << 20)
    machine = CudaBackend(attention_provider="cublas")
    try:
        machine.prepare(build_exec_graph(memgraph), built.feed(llama.RandomWeights(config, 0), llama.random_ids(config, 16, 0)))
        builds = machine.services.cache.builds
    finally:
        machine.close()
    nodes = memgraph.by_id()
    attention = [n for n in memgraph.nodes if n.kernel == "attention"]
    einsums = [n for n in memgraph.nodes if n.kernel == "einsum"]
    by_shape = {(tuple(nodes[n.inputs[0]].shape), tuple(nodes[n.inputs[1]].shape), bool(n.attrs.get("causal"))) for n in attention}
    gemm_shapes = {(n.attrs["equation"], *(tuple(nodes[i].shape) for i in n.inputs)) for n in einsums}
    assert len(attention) == 2 * 10 and builds["attention"] == len(by_shape) == 2  # diagonal blocks and the rest
    assert builds["gemm"] == len(gemm_shapes) < len(einsums)


@pytest.mark.parametrize("source", ["checkpoint", "random"])
def test_embedding_rows_are_the_table_rows(tmp_path, source) -> None:
    """The embedding lookup reads only the rows of the ids, and they are the table's rows, converted."""
    from dataclasses import replace

    config = replace(_checkpoint(tmp_path / "m", SMALL, "float32"), dtype="float16")
    weights = llama.CheckpointWeights(tmp_path / "m", config) if source == "checkpoint" else llama.RandomWeights(config, 3)
    ids = np.array([5, 0, 63, 5, 17])
    np.testing.assert_array_equal(llama.embed(weights, ids, config), weights["model.embed_tokens.weight"][ids])
    assert llama.embed(weights, ids, config).dtype == np.float16


def test_turnip_llama_prints_its_phases(capsys) -> None:
    """The last summary line: each set-up phase in seconds, and the process's time since it started."""
    import re

    from turnip_cli.main import main

    assert main(["llama", "--config", "tiny", "--tokens", "16", "--memory", "100KiB", "--backend", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    found = re.fullmatch(r"phases: load ([\d.]+) s \(model ([\d.]+) s, weights into host memory ([\d.]+) s\), compile ([\d.]+) s, "
                         r"prepare ([\d.]+) s, run ([\d.]+) s; ([\d.]+) s end to end", lines[-1])
    assert found, lines[-1]
    load, model, weights, compile_s, prepare, run, wall = (float(x) for x in found.groups())
    assert abs(load - model - weights) <= 0.011 and run > 0
    assert wall >= load + compile_s + prepare + run - 0.05  # the process's clock counts the imports too
    assert any(line.startswith("peak arena use:") for line in lines[:-1])  # the run summary's lines come before, as they were


def test_inputs_are_read_into_each_pinned_chunk_as_it_is_pinned() -> None:
    """Under the simulator, with chunks of 16 KiB: every input held in storage is in its chunk after
    `prepare`, equal to the value it was fed, though each was queued while later chunks were still taken."""
    from passes.pipeline import compile_taskgraph
    from runtime.backends.cuda import CudaBackend, simulated
    from runtime.graph import build_exec_graph

    if not simulated():
        pytest.skip("runs the cuda backend under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
    config = llama.load_config("tiny")
    built = llama.build_llama(config, 16, 4)
    memgraph = compile_taskgraph(built.graph, 200 << 10)
    inputs = built.feed(llama.RandomWeights(config, 2), llama.random_ids(config, 16, 2))
    machine = CudaBackend(attention_provider="cublas", chunk_bytes=16 << 10)
    try:
        machine.prepare(build_exec_graph(memgraph), inputs)
        stored = [(i, node) for i, node in enumerate(memgraph.nodes) if node.op == "input" and node.storage is not None]
        assert len(machine.views.storage.chunks) > 3 and len(stored) > 10
        for i, node in stored:
            np.testing.assert_array_equal(machine.views.host[i], materialize(inputs[node.task]), err_msg=node.task)
    finally:
        machine.close()


def test_a_block_stored_as_it_is_computed_is_its_view_in_the_mapped_file(tmp_path) -> None:
    """`mapped()`: a stored tensor, or a block of leading rows, in its stored dtype is a view of the file's
    map (no copy); a converted one, or a block of columns (not contiguous in the file), is not."""
    from frontend.safetensors import SafeTensors

    config = _checkpoint(tmp_path / "m", SMALL, "float32")
    name = "model.layers.0.mlp.up_proj.weight"
    file = SafeTensors.open(tmp_path / "m")
    whole = file.lazy(name, "float32")
    view, mapping = whole.mapped()
    assert np.shares_memory(view, mapping) and not view.flags.writeable
    np.testing.assert_array_equal(view, file.get(name))
    rows = whole[2:5]
    np.testing.assert_array_equal(rows.mapped()[0], file.get(name)[2:5])
    assert whole[:, 1:3].mapped() is None
    assert file.lazy(name, "float16").mapped() is None
    assert config.dtype == "float32"


def test_checkpoint_weights_are_read_in_place_from_the_registered_map() -> None:
    """Under the simulator: the cuda backend reads a checkpoint's weights stored in the compute dtype where
    the file's map holds them (one registration per file, dropped at close), stages the rest, and
    computes what the cpu backend computes."""
    from passes.pipeline import compile_taskgraph
    from runtime.backends.cuda import CudaBackend, simulated

    if not simulated():
        pytest.skip("runs the cuda backend under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        config = _checkpoint(Path(folder) / "m", SMALL, "float32")
        built = llama.build_llama(config, 8, 8)
        memgraph = compile_taskgraph(built.graph, 96 << 10)
        assert memgraph.count("reload") > 0
        ids = llama.random_ids(config, 8, 3)
        inputs = built.feed(llama.CheckpointWeights(Path(folder) / "m", config), ids)
        machine = CudaBackend(attention_provider="cublas")
        result = execute(memgraph, backend=machine, inputs=inputs, verify=False, close=False)
        try:
            stored = {node.task for node in memgraph.nodes if node.op == "input" and node.storage is not None}
            in_file = {task for task in stored if mapped(inputs[task]) is not None}
            assert len(in_file) >= 4 and in_file <= machine.external_inputs()
            assert len(machine.mappings) == 1
            assert any("read where they are" in line for line in result.summary.notes)
        finally:
            machine.close()
        assert machine.mappings == {}
        expected = execute(memgraph, backend="cpu", inputs=inputs, verify=False)
        for key, array in expected.outputs.items():
            np.testing.assert_allclose(result.outputs[key], array, rtol=1e-5, atol=1e-5, err_msg=key)


def test_a_session_on_cuda_keeps_checkpoint_weights_where_the_file_map_holds_them(tmp_path) -> None:
    """Under the simulator: a cuda session's weights stored in the compute dtype are views of the file's
    map (page-locked in place, no host copy), its tokens are the cpu session's, and closing it drops the
    registration."""
    from runtime.backends.cuda import simulated
    from turnip import Session

    if not simulated():
        pytest.skip("runs the cuda backend under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
    _checkpoint(tmp_path / "m", SMALL, "float32")
    prompts = [np.array([3, 1, 4])]
    with Session(weights=tmp_path / "m", memory=4 << 20, backend="cpu") as session:
        expected = session.generate(prompts, 1).tokens
    session = Session(weights=tmp_path / "m", memory=104 << 20, backend="cuda")
    try:
        got = session.generate(prompts, 1).tokens
        name = "model.layers.1.mlp.up_proj.weight"
        view = session.weights[name]
        assert len(session.host.mappings) == 1
        assert any(np.shares_memory(view, mapping) for mapping in session.host.mappings.values())
    finally:
        session.close()
    assert session.host.mappings == {}
    np.testing.assert_array_equal(got, expected)
