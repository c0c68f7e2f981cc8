"""Where does the plan search's time go? A timeline of one `turnip llama` choosing (issue 45: 32k at 1 GiB
chose in 4.2-4.4 s on the H100 host with 16 processes against 3.3 s on 2 cores).

    python3 bench/investigations/search_trace.py -- llama --config 7b --tokens 32768 --memory 1GiB --backend cuda

Runs the command in this interpreter with the search's parent-side steps timed (turnip/search.py and
turnip/forks.py wrapped, nothing changed): each fork's start (how long `start` held the parent), each
candidate's end as the parent learns of it (its kind and sim seconds), each dimension ranked, the graphs
built here, and the chosen plan's verification. Clear the choice cache first (TURNIP_CACHE=an empty folder)
or nothing is searched. Prints the timeline to stderr, seconds from the search's start.
"""

from __future__ import annotations

import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from turnip import forks, search  # noqa: E402

ORIGIN = [None]


def _say(text: str) -> None:
    now = time.perf_counter()
    if ORIGIN[0] is None:
        ORIGIN[0] = now
    print(f"  search +{now - ORIGIN[0]:7.3f} s  {text}", file=sys.stderr, flush=True)


def _timed(owner, name: str, describe) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        result = original(*args, **kwargs)
        text = describe(args, kwargs, result)
        if text:
            _say(f"{text} ({(time.perf_counter() - began) * 1e3:.0f} ms)")
        return result

    setattr(owner, name, wrapper)


def _short(candidate) -> str:
    describe = getattr(candidate, "describe", None)
    return describe() if callable(describe) else str(candidate)


def main() -> None:
    argv = sys.argv[1:]
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    _timed(search.Search, "run", lambda a, k, r: "search done")
    _timed(search.Search, "_evaluate_start", lambda a, k, r: f"default plan evaluated: {r.kind} {(r.seconds or 0):.3f}")
    _timed(search.Search, "_rank", lambda a, k, r: f"ranked {r.dimension}: {r.chosen}")
    _timed(search.Search, "_record", lambda a, k, r: f"outcome {a[2].kind:8s} {(a[2].seconds or 0):7.3f} s  {_short(a[1])}")
    _timed(search.Search, "_graph", lambda a, k, r: None)
    _timed(search.Search, "_choice", lambda a, k, r: "the chosen plan taken (unpickled or compiled) and verified")
    _timed(forks.ForkPool, "start", lambda a, k, r: f"fork      {_short(a[1])}")
    _timed(forks.ForkPool, "stop", lambda a, k, r: f"stopped   {_short(a[1])}")
    _timed(search, "verified", lambda a, k, r: "verified")
    original_init = search.Search.__init__

    def init(self, *args, **kwargs):
        ORIGIN[0] = None
        _say("search begins")
        original_init(self, *args, **kwargs)

    search.Search.__init__ = init
    from turnip_cli.main import cli

    sys.argv = ["turnip", *argv]
    try:
        cli()
    except SystemExit:
        pass


if __name__ == "__main__":
    main()
