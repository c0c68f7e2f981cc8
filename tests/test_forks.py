"""`ForkPool`: closures run in forked children, results come back by key, errors are raised in the parent."""

from __future__ import annotations

import functools
import operator
import os
import subprocess
import sys
import time

import pytest

from turnip import forks
from turnip_ir.errors import BudgetError

pytestmark = pytest.mark.skipif(not forks.available(), reason="fork is not available here")


def _all(pool: forks.ForkPool) -> dict:
    found = {}
    while pool.children:
        found.update(pool.wait())
    return found


def test_closures_run_in_children_and_their_results_come_back_by_key():
    big = list(range(100_000))  # the child reads the parent's objects as they are: nothing is pickled to it
    with forks.ForkPool(2) as pool:
        pool.start("sum", lambda: (sum(big), os.getpid()))
        pool.start("len", lambda: (len(big), os.getpid()))
        assert pool.free == 0
        found = _all(pool)
    assert found["sum"][0] == sum(big) and found["len"][0] == len(big)
    assert os.getpid() not in (found["sum"][1], found["len"][1])


def test_a_childs_turnip_error_is_raised_as_it_is_and_any_other_with_its_traceback():
    with forks.ForkPool(1) as pool:
        pool.start("budget", lambda: (_ for _ in ()).throw(BudgetError("no room for 'x'")))
        with pytest.raises(BudgetError, match="no room for 'x'"):
            _all(pool)
        pool.start("bug", lambda: 1 // 0)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            _all(pool)
        assert not pool.children


def test_a_stopped_child_is_killed_and_its_result_never_comes():
    with forks.ForkPool(2) as pool:
        pool.start("slow", lambda: time.sleep(60))
        pool.start("quick", lambda: "done")
        child = pool.children["slow"][0]
        pool.stop("slow")
        assert not child.is_alive() and child.exitcode is not None
        assert _all(pool) == {"quick": "done"}


def test_a_child_that_dies_without_an_answer_is_an_error():
    with forks.ForkPool(1) as pool:
        pool.start("gone", lambda: os._exit(3))
        with pytest.raises(RuntimeError, match="exit code 3"):
            _all(pool)


def test_default_slots_count_physical_cores_and_take_the_variable(monkeypatch, tmp_path):
    from turnip_ir import pools
    from turnip_ir.errors import TurnipError

    assert pools._cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert 1 <= pools.physical_cores() <= pools.cores()
    monkeypatch.delenv(forks.SLOTS_VARIABLE, raising=False)
    assert forks.default_slots() == pools.physical_cores()
    monkeypatch.setenv(forks.SLOTS_VARIABLE, "3")
    assert forks.default_slots() == 3
    monkeypatch.setenv(forks.SLOTS_VARIABLE, "many")
    with pytest.raises(TurnipError, match="TURNIP_SEARCH_WORKERS='many'"):
        forks.default_slots()


def test_physical_cores_count_a_core_s_hyperthreads_once(monkeypatch):
    from pathlib import Path

    from turnip_ir import pools

    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}  # 2 cores, 2 threads each
    monkeypatch.setattr(pools.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: siblings[int(self.parts[-3][3:])] if "topology" in self.parts else real(self, *a, **k))
    assert pools.physical_cores() == 2
    monkeypatch.setattr(pools.os, "sched_getaffinity", lambda pid: {0, 2}, raising=False)  # one core's two threads
    assert pools.physical_cores() == 1


def test_a_server_forked_child_does_not_run_the_callers_script_again(tmp_path):
    """A script without an `if __name__ == "__main__"` guard (a user's, whose session searches a plan in
    children forked from a server): its work runs once, in the script, not again in each child."""
    if not forks.available("forkserver"):
        pytest.skip("forkserver is not available here")
    script = tmp_path / "unguarded.py"
    script.write_text("import functools, operator\n"
                      "from turnip import forks\n"
                      "print('script ran', flush=True)\n"
                      "pool = forks.ForkPool(2, 'forkserver')\n"
                      "pool.start('a', functools.partial(operator.add, 2, 3))\n"
                      "done = []\n"
                      "while not done:\n"
                      "    done = pool.wait(10)\n"
                      "print('result', done, flush=True)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["script ran", "result [('a', 5)]"]


def test_a_server_started_early_serves_the_children_later():
    """`start_server` (a session's, before its weights are page-locked) and then a pool of that method."""
    if not forks.available("forkserver"):
        pytest.skip("forkserver is not available here")
    forks.start_server(("turnip.search",))
    pool = forks.ForkPool(2, "forkserver", preload=("turnip.search",))
    pool.start("sum", functools.partial(operator.add, 2, 3))
    done = []
    while not done:
        done = pool.wait(30)
    assert done == [("sum", 5)]
