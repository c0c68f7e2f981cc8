"""Golden tests of the compiler passes on the seed's small examples, through Python and through turnip-opt."""

from __future__ import annotations

import json

import pytest

from passes.insert_memory_deps import insert_memory_deps
from passes.insert_offload import insert_offload
from passes.pipeline import compile_taskgraph
from passes.compile_stats import CompileStats
from turnip_cli.opt import main as opt_main
from turnip_ir.errors import BudgetError, InputError
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.memgraph import MemGraph
from turnip_ir.taskgraph import TaskGraph

SLOT = 16 * 16 * 4  # one 16x16 float32 tile: 1024 bytes, a multiple of the 256-byte alignment


def seven_tensors() -> TaskGraph:
    """Seven equal tiles, five live at once at 'd' (x, a, b, c, d), with b needed again only at the end."""
    g = TaskGraph(1)
    x = g.input((16, 16), id="x")
    a = g.relu(x, device=0, id="a")
    b = g.scale(x, 0.5, device=0, id="b")
    c = g.add(a, b, device=0, id="c")
    d = g.mul(c, x, device=0, id="d")
    e = g.add(d, a, device=0, id="e")
    g.add(e, b, device=0, id="f")
    g.output("f")
    return g


def _by_task(m: MemGraph, op: str) -> list:
    return [n for n in m.nodes if n.op == op]


def test_five_slots_reuse_locations_without_offload():
    m = compile_taskgraph(seven_tensors(), 5 * SLOT)
    assert _by_task(m, "offload") == [] and _by_task(m, "reload") == []
    assert sum(len(n.mem_deps) + len(n.redundant_deps) for n in m.nodes) > 0
    assert max(n.loc[0] + n.loc[1] for n in m.nodes) <= 5 * SLOT


def test_four_slots_offload_and_reload_the_farthest_tensor():
    m = compile_taskgraph(seven_tensors(), 4 * SLOT)
    offloads, reloads = _by_task(m, "offload"), _by_task(m, "reload")
    assert [n.task for n in offloads] == ["b"] and [n.task for n in reloads] == ["b"]
    by_id = m.by_id()
    assert reloads[0].inputs == (offloads[0].id,)
    f = next(n for n in m.nodes if n.task == "f")
    assert reloads[0].id in f.inputs
    assert by_id[offloads[0].inputs[0]].task == "b" and offloads[0].mem_deps == ()  # runs beside b's readers
    d = next(n for n in m.nodes if n.task == "d")  # takes b's location: waits for the offload and the readers
    assert d.loc == by_id[offloads[0].inputs[0]].loc and offloads[0].id in d.mem_deps


def test_redundant_edge_is_marked_not_kept():
    m = insert_offload(seven_tensors(), 5 * SLOT)
    added, redundant = insert_memory_deps(m)
    assert redundant >= 1
    marked = [(n, dep) for n in m.nodes for dep in n.redundant_deps]
    by_id = m.by_id()
    for node, dep in marked:
        assert dep not in node.mem_deps
        assert _data_path(by_id, dep, node.id)


def _data_path(by_id, src: int, dst: int) -> bool:
    stack, seen = [dst], set()
    while stack:
        node_id = stack.pop()
        if node_id == src:
            return True
        for i in by_id[node_id].inputs:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return False


def test_impossible_budget_names_the_op_and_bytes():
    with pytest.raises(BudgetError) as err:
        compile_taskgraph(seven_tensors(), 2 * SLOT)
    assert str(err.value) == (
        "op 'c' (add on GPU 0) needs 3072 bytes but the budget is 2048 bytes; the smallest budget that compiles is 3072 (3.00 KiB)"
    )


def test_stats_count_offload_bytes_and_edges():
    stats = CompileStats()
    m = compile_taskgraph(seven_tensors(), 4 * SLOT, stats=stats)
    assert stats.ops["offload"] == 1 and stats.bytes_offloaded == SLOT == stats.bytes_reloaded
    assert stats.memory_edges == sum(len(node.mem_deps) for node in m.nodes) > 0  # each stage counted once
    assert "bytes offloaded" in stats.table() and stats.peak_memory == {0: 4 * SLOT}


def test_turnip_opt_pipeline_writes_memgraph_json(tmp_path, capsys):
    src, out = tmp_path / "g.json", tmp_path / "m.json"
    src.write_text(seven_tensors().dumps())
    code = opt_main([str(src), "-p", f"turnip-memgraph{{budget={4 * SLOT} schedule=dfs}}", "--emit", "json", "-o", str(out), "--stats"])
    assert code == 0
    m = memgraph_from_json(json.loads(out.read_text()))
    assert m.count("offload") == 1 and m.outputs["f"] in m.by_id()
    assert "memory edges added" in capsys.readouterr().out


@pytest.mark.parametrize("pass_name", ["turnip-memgraph", "turnip-insert-offload"])
def test_order_is_an_unknown_option_now_that_schedule_replaced_it(tmp_path, capsys, pass_name):
    src, out = tmp_path / "g.json", tmp_path / "m.json"
    src.write_text(seven_tensors().dumps())
    assert opt_main([str(src), "-p", f"{pass_name}{{budget={4 * SLOT} order=dfs}}", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("turnip-opt: error: ") and not out.exists()
    assert '["order"] not found' in err and '"schedule"' in err


@pytest.mark.parametrize("pass_name", ["turnip-memgraph", "turnip-insert-offload"])
def test_a_pass_spec_without_the_budget_is_one_line_naming_it(tmp_path, capsys, pass_name):
    src, out = tmp_path / "g.json", tmp_path / "m.json"
    src.write_text(seven_tensors().dumps())
    assert opt_main([str(src), "-p", pass_name, "-o", str(out)]) == 1
    assert capsys.readouterr().err == f'turnip-opt: error: {pass_name} requires argument "budget"\n'
    assert not out.exists()
    assert opt_main([str(src), "-p", f"{pass_name}{{budget=0}}"]) == 1
    assert capsys.readouterr().err.strip() == f"turnip-opt: error: {pass_name} needs the option budget=BYTES with a positive number of bytes, got 0"


def test_every_stage_adds_what_it_declares_and_the_shared_arrays_stay_in_step():
    from passes.compilation import Compilation
    from passes.pipeline import memgraph_stages
    from passes.place_devices import place_devices
    from turnip_ir.memarrays import MemArrays

    state = Compilation(seven_tensors())
    for stage in memgraph_stages(4 * SLOT):
        state.run(stage)
        assert all(getattr(state, name) is not None for name in stage.adds), stage.name
    assert isinstance(state.graph, MemGraph) and state.source.to_json() == place_devices(seven_tensors()).to_json()
    fresh = MemArrays.build(state.graph.nodes)  # after minimize and reduce dropped edges from the shared arrays
    for name in ("data_ptr", "data_idx", "mem_ptr", "mem_idx", "read_ptr", "read_idx", "space", "start", "end"):
        assert (getattr(state.arrays, name) == getattr(fresh, name)).all(), name
    assert state.stats.edges_added > 0 and state.stats.ops["offload"] == 1
    assert state.graph.to_json() == compile_taskgraph(seven_tensors(), 4 * SLOT).to_json()


def test_an_unknown_schedule_is_named_with_the_known_ones():
    with pytest.raises(InputError, match=r"^unknown schedule 'fifo' \(known: given, dfs, memory\)$"):
        compile_taskgraph(seven_tensors(), 4 * SLOT, schedule="fifo")


def test_turnip_opt_budget_error_exits_2_and_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "g.json", tmp_path / "m.json"
    src.write_text(seven_tensors().dumps())
    code = opt_main([str(src), "-p", "turnip-memgraph{budget=2048}", "-o", str(out)])
    assert code == 2 and not out.exists()
    assert "op 'c' (add on GPU 0) needs 3072 bytes" in capsys.readouterr().err


def test_single_passes_compose_to_a_verified_memgraph(tmp_path, capsys):
    src = tmp_path / "g.json"
    g = seven_tensors()
    for node in g.nodes.values():
        if node.op != "input":
            node.device = None
    src.write_text(g.dumps())
    steps = f"turnip-place-devices,turnip-insert-offload{{budget={4 * SLOT}}},turnip-insert-memory-deps,"
    steps += "turnip-minimize-memory-deps,turnip-reduce-memory-deps,turnip-verify-memgraph"
    assert opt_main([str(src), "-p", steps]) == 0
    text = capsys.readouterr().out
    assert "turnip.offload" in text and "turnip.reload" in text


def test_single_passes_report_the_same_stats_as_the_named_pipeline(tmp_path, capsys):
    src = tmp_path / "g.json"
    src.write_text(seven_tensors().dumps())
    steps = f"turnip-place-devices,turnip-insert-offload{{budget={4 * SLOT}}},turnip-insert-memory-deps,"
    steps += "turnip-minimize-memory-deps,turnip-reduce-memory-deps,turnip-verify-memgraph"
    tables = []
    for pipeline in (steps, f"turnip-memgraph{{budget={4 * SLOT}}}"):
        assert opt_main([str(src), "-p", pipeline, "-o", str(tmp_path / "out.mlir"), "--stats"]) == 0
        lines = capsys.readouterr().out.splitlines()
        tables.append([line for line in lines if not line.startswith("time ")])
    assert tables[0] == tables[1]
    assert any(line.split()[:3] == ["ops", "offload", "1"] for line in tables[0])


@pytest.mark.parametrize("placement", ["loosest", "first-fit"])
def test_both_placements_give_verified_memgraphs(placement):
    from tools.random_graphs import random_taskgraph
    from passes.insert_offload import minimum_budget

    graph = random_taskgraph(5, tasks=120, devices=3, sizes=(8, 16, 24), window=10)
    memgraph = compile_taskgraph(graph, minimum_budget(graph), placement=placement)
    assert memgraph.count("offload") > 0


def test_loosest_placement_reuses_the_region_freed_longest_ago():
    from passes.allocator import DeviceMemory

    # loosest takes [512, 768), freed at step 1; first-fit the lowest free region, [0, 256), freed at step 5
    for placement, want in (("loosest", 512), ("first-fit", 0)):
        memory = DeviceMemory(3 * 256, placement)
        for tensor in range(3):
            memory.take(tensor * 256, 256, tensor)
        memory.release(2, step=1)
        memory.release(0, step=5)
        assert memory.place_free(256) == want


def _odd_tiles() -> TaskGraph:
    """10x10 float32 tiles: 400 bytes, not a multiple of the 256-byte alignment."""
    g = TaskGraph(1)
    x = g.input((10, 10), id="x")
    w = g.input((10, 10), id="w")
    y = g.matmul(x, w, device=0, id="y")
    z = g.add(y, x, device=0, id="z")
    g.output(g.relu(z, device=0, id="out"))
    return g


def test_a_budget_equal_to_the_exact_working_set_compiles():
    from passes.insert_offload import minimum_budget

    graph = _odd_tiles()
    assert minimum_budget(graph) == 3 * 400  # matmul: x, w and y, packed at element alignment
    memgraph = compile_taskgraph(graph, 1200)
    assert all(node.loc[1] == 400 for node in memgraph.nodes if node.loc is not None)
    with pytest.raises(BudgetError, match=r"op 'y' \(matmul on GPU 0\) needs 1200 bytes but the budget is 1199 bytes"):
        compile_taskgraph(graph, 1199)


def test_ample_budgets_keep_offsets_256_aligned_and_sizes_exact():
    memgraph = compile_taskgraph(_odd_tiles(), 1 << 20)
    placed = [node.loc for node in memgraph.nodes if node.loc is not None]
    assert all(offset % 256 == 0 and size == 400 for offset, size in placed)


def test_zero_size_tensors_compile_and_verify():
    g = TaskGraph(1)
    x = g.input((0, 4), id="x")
    y = g.relu(x, device=0, id="y")
    g.output(g.scale(y, 2.0, device=0, id="z"))
    memgraph = compile_taskgraph(g, 256)
    assert [node.loc[1] for node in memgraph.nodes] == [0, 0, 0]


@pytest.mark.parametrize("emit", ["mlir", "json", "dot"])
def test_graph_driver_and_xdsl_driver_print_the_same(tmp_path, capsys, emit):
    """turnip-opt runs GraphPasses on the Python graphs; --split-input-file forces xDSL's own driver."""
    src = tmp_path / "g.json"
    src.write_text(seven_tensors().dumps())
    outputs = []
    for extra in ([], ["--split-input-file"]):
        out = tmp_path / f"out{len(outputs)}"
        assert opt_main([str(src), "-p", f"turnip-memgraph{{budget={4 * SLOT}}}", "--emit", emit, "-o", str(out), *extra]) == 0
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1] and "offload" in outputs[0]


def test_verify_pass_checks_data_dependencies_against_a_given_taskgraph(tmp_path, capsys):
    src, good, bad = tmp_path / "g.json", tmp_path / "m.json", tmp_path / "bad.json"
    src.write_text(seven_tensors().dumps())
    assert opt_main([str(src), "-p", f"turnip-memgraph{{budget={4 * SLOT}}}", "--emit", "json", "-o", str(good)]) == 0
    check = f'turnip-verify-memgraph{{taskgraph="{src}"}}'
    assert opt_main([str(good), "-p", check, "--emit", "json"]) == 0
    doc = json.loads(good.read_text())
    c = next(node for node in doc["nodes"] if node["task"] == "c")
    c["inputs"] = [c["inputs"][0], c["inputs"][0]]  # c = a + a instead of a + b: race-free, but wrong
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert opt_main([str(bad), "-p", "turnip-verify-memgraph", "--emit", "json"]) == 0  # no taskgraph: cannot tell
    assert opt_main([str(bad), "-p", check, "--emit", "json"]) == 3
    assert "node 3 (add 'c'): operand 1 comes from 'a', not 'b'" in capsys.readouterr().err


def _floor_in(err: BudgetError) -> int:
    import re

    found = re.search(r"the smallest budget that compiles is (\d+) \(", str(err))
    assert found, str(err)
    return int(found.group(1))


@pytest.mark.parametrize("seed", range(6))
def test_the_budget_error_states_the_smallest_budget_that_compiles(seed):
    """Issue 27 item 16: the error names the floor; compiling at it succeeds, one byte less fails."""
    from frontend.workloads import ffn as ffn_workload
    from tools.random_graphs import random_taskgraph

    if seed == 0:
        graph = ffn_workload.build(ffn_workload.FfnConfig(layers=2, tokens=16, hidden=32, ffn=64, block=16, gpus=2, placement="layers")).taskgraph()
    else:
        graph = random_taskgraph(seed, tasks=25, devices=1 + seed % 3)
    with pytest.raises(BudgetError) as err:
        compile_taskgraph(graph, 64)
    floor = _floor_in(err.value)
    memgraph = compile_taskgraph(graph, floor)
    assert memgraph.budget == floor
    with pytest.raises(BudgetError) as again:
        compile_taskgraph(graph, floor - 1)
    assert _floor_in(again.value) == floor
