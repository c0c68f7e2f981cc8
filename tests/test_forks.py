"""`ForkPool`: closures run in forked children, results come back by key, errors are raised in the parent."""

from __future__ import annotations

import os
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
