"""A session keeps its budget for the whole process (issue 44): one arena per call, sized before the first
run from every graph the call runs, and a dropped backend's device memory unreachable by the time the
driver is told to free it (numba frees what it learns of later only past a threshold of pending bytes)."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest

from frontend.workloads import llama
from turnip import Session

CUDA_RESERVE = (80 << 20) + 2 * (4 << 20) + (4 << 10)
"""The cuda backend's library allowance beside the arena (as tests/test_generate.py)."""


@pytest.fixture
def small_config(tmp_path):
    """Two layers of two heads (a cache's prefill skips the last layer's attention: the first has it), small:
    numba-cuda's simulator runs every kernel thread in Python."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**llama.PRESETS["tiny"], "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                                "intermediate_size": 64}))
    return str(path)


def _simulated() -> bool:
    from runtime.backends.cuda import simulated

    return simulated()


def test_a_call_sizes_the_arena_once_before_its_first_run(small_config, monkeypatch):
    """Decode steps that read more pinned cache (more GPU page tables) than the prefills: the arena is sized
    for every graph of the call before anything runs, so the call builds one backend and every plan gets
    the same arena; a second call of the same shapes builds and compiles nothing. (The page tables are
    made 1/16 of what is pinned, where the real 2 MiB per GiB needs a 7b's 17 GB cache to show the same.)"""
    if not _simulated():
        pytest.skip("runs numba-cuda's simulator")
    from runtime.backends.cuda import devices

    monkeypatch.setattr(devices, "page_table_bytes", lambda pinned: max(pinned, 0) // 16)
    prompts = [np.arange(1, 3) + b for b in range(4)]
    with Session(config=small_config, memory=(1 << 20) + CUDA_RESERVE + (16 << 20), backend="cuda", kv_block=64) as session:
        first = session.generate(prompts, 2)
        assert session.backends_built == 1
        assert {plan.budget for plan in session.cache.values()} == {session.arena}
        second = session.generate(prompts, 2)
        assert session.backends_built == 1 and second.compiles == 0
        assert (second.tokens == first.tokens).all()


def test_a_dropped_backend_holds_no_device_memory_when_the_driver_frees(small_config, monkeypatch):
    """When a session drops its backend (here: a later call that needs a smaller arena), everything that
    referred to the old arenas is gone by the time the driver is asked to free them."""
    if not _simulated():
        pytest.skip("runs numba-cuda's simulator")
    from runtime.backends.cuda.driver import SimDriver

    arenas: list[weakref.ref] = []
    alive_at_collect: list[list[bool]] = []

    def collect(driver, contexts):
        gc.collect()
        alive_at_collect.append([ref() is not None for ref in arenas])

    monkeypatch.setattr(SimDriver, "collect", collect)
    with Session(config=small_config, memory=(1 << 20) + CUDA_RESERVE + (16 << 20), backend="cuda") as session:
        session.generate([np.array([1, 2, 3])], 1)
        arenas.extend(weakref.ref(_base(arena)) for arena in session._machine.devices.arenas)
        session.generate([np.arange(1, 60)], 1)  # a longer prefill: a larger attention workspace, a smaller arena
        assert session.backends_built == 2
    assert alive_at_collect and alive_at_collect[0] == [False] * len(arenas)


def _base(array):
    """The host array under a simulated device array (what its views keep alive)."""
    host = array._ary
    while host.base is not None:
        host = host.base
    return host


def test_process_memory_keeps_the_peak_since_reset_and_says_nothing_without_the_driver(monkeypatch):
    """The driver's per-process figure (NVML) per GPU: the first reading is the context, the peak is the
    most seen since `reset`; where NVML cannot be loaded every figure is None (and nothing is printed)."""
    from runtime import process_memory

    readings = iter([[100, 50], [400, 70], [300, 90], [250, 60], [260, 60]])

    class Fake:
        def used_by(self, index, pid):
            return current[index]

    monkeypatch.setattr(process_memory, "_Nvml", Fake)
    current = next(readings)
    held = process_memory.ProcessMemory(2, period=3600)  # the thread samples once, then sleeps
    assert held.available and held.context_bytes == [100, 50]
    current = next(readings)
    assert held.peak() == [400, 70]
    current = next(readings)
    assert held.peak() == [400, 90]
    current = next(readings)
    held.reset()
    current = next(readings)
    assert held.peak() == [260, 60]

    def missing():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(process_memory, "_Nvml", missing)
    blind = process_memory.ProcessMemory(1)
    assert not blind.available and blind.peak() == [None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [process_memory._nvml_index(d) for d in (0, 1)] == [3, 1]


def test_a_second_call_of_the_same_shapes_loads_no_plan_again(small_config, monkeypatch):
    """The backend keeps the plans it loaded (views, storage, built works): a session's second call of the
    same shapes, which goes back and forth between its prefill and its decode plans, builds no vertex's
    work again, and gives the same tokens."""
    if not _simulated():
        pytest.skip("runs numba-cuda's simulator")
    from runtime.backends.cuda import CudaBackend

    built = []
    build = CudaBackend._build
    monkeypatch.setattr(CudaBackend, "_build", lambda self, graph, vertex: built.append(vertex) or build(self, graph, vertex))
    prompts = [np.arange(1, 6), np.arange(7, 10)]
    with Session(config=small_config, memory=(1 << 20) + CUDA_RESERVE + (16 << 20), backend="cuda", kv_block=4) as session:
        first = session.generate(prompts, 3)  # the cache crosses a column: two decode plans beside the prefill's
        assert first.compiles == 3 and built
        built.clear()
        second = session.generate(prompts, 3)
        assert built == [] and session.backends_built == 1
    assert (second.tokens == first.tokens).all()


def test_a_calls_kv_cache_is_one_region_of_aligned_buffers_reused_by_the_next_call(small_config):
    """The cache's 2 x layers buffers lie in one host region (page-locked at once on cuda: one registration,
    not one a buffer), each on a KV_ALIGN boundary, none overlapping another; a later call that needs no
    more takes the same bytes."""
    from turnip.session import KV_ALIGN

    with Session(config=small_config, memory=1 << 30, backend="cpu", kv_block=4) as session:
        prompts = [np.arange(1, 12), np.arange(1, 5)]
        cache = session._empty_cache(prompts, 5, True)
        buffers = [t for pair in cache.whole for t in pair]
        assert len(buffers) == 2 * session.config.num_hidden_layers
        region = session.host._lasting["kv"]
        base = region.ctypes.data
        spans = sorted((t.ctypes.data - base, t.ctypes.data - base + t.nbytes) for t in buffers)
        assert all(np.shares_memory(t, region) for t in buffers)
        assert all(start % KV_ALIGN == 0 for start, _ in spans)
        assert all(stop <= after for (_, stop), (after, _) in zip(spans, spans[1:])), "buffers overlap"
        assert spans[-1][1] <= region.nbytes
        assert buffers[0].shape == (16, 2, session.config.num_key_value_heads * session.config.head_dim)
        smaller = session._empty_cache([np.arange(1, 4)], 2, True)
        assert session.host._lasting["kv"] is region
        assert all(np.shares_memory(t, region) for pair in smaller.whole for t in pair)


def test_a_processs_first_call_reports_the_device_peak_of_the_monitor_its_backend_made(small_config, monkeypatch):
    """No monitor when the call begins (the process's first cuda backend makes it, before its first arena):
    the call's peak is that monitor's, since it was made within the call; a later call resets the peak."""
    from runtime import process_memory

    class Monitor:
        available, context_bytes, resets = True, [512], 0

        def reset(self):
            self.resets += 1

        def peak(self):
            return [4096]

    made = Monitor()
    monitors = iter([None, made, made, made])
    monkeypatch.setattr(process_memory, "current", lambda: next(monitors))
    with Session(config=small_config, memory=1 << 30, backend="cpu") as session:
        session.backend = "cuda"  # as a cuda session sees it; nothing runs
        assert session._device_peak(session._device_memory()) == (4096, 512)  # first call: made meanwhile
        assert session._device_peak(session._device_memory()) == (4096, 512) and made.resets == 1
        session.backend = "cpu"
