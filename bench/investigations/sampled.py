"""Where does a command's wall time go? A sampling profiler of the whole process, imports included.

    python3 bench/investigations/sampled.py --json out.json [--until S] -- -m turnip_cli.main generate ...
    python3 bench/investigations/sampled.py --timeline out.json      # the main thread's phases, in order

Runs the module (or script) after `--` in this interpreter with a thread that records every thread's stack
every `--every` seconds (sys._current_frames: no tracing hooks, so the program runs at its own speed).
Prints, for the main thread and for the window [start, --until seconds] (or the whole run), the
functions on the most samples (inclusive: each function counted once per sample it is on the stack of)
and the innermost project frames (exclusive), as seconds; with --json every sample's stack is written for
a later look. Turnip's own code, the standard library and the packages are named by file and function.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def frame_name(code) -> str:
    path = code.co_filename
    if path.startswith(ROOT):
        path = os.path.relpath(path, ROOT)
    else:
        parts = path.split(os.sep)
        for marker in ("site-packages", "dist-packages", "lib"):
            if marker in parts:
                path = "/".join(parts[len(parts) - parts[::-1].index(marker):])
                break
    return f"{path}:{code.co_name}"


class Sampler:
    def __init__(self, every: float):
        self.every, self.samples, self.began = every, [], time.perf_counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self.names = {}

    def start(self):
        self.thread.start()

    def _run(self):
        me, last = threading.get_ident(), 0.0
        while not self.stop.wait(self.every):
            now = time.perf_counter() - self.began
            dt, last = now - last, now  # a sample stands for the time since the last (the GIL may delay one)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack = []
                while frame is not None and len(stack) < 60:
                    stack.append(frame_name(frame.f_code))
                    frame = frame.f_back
                self.samples.append((round(now, 4), round(dt, 4), names.get(ident, str(ident)), stack[::-1]))


def report(samples, until: float | None, thread: str = "MainThread", top: int = 40, since: float = 0.0) -> None:
    inclusive, exclusive, total = collections.Counter(), collections.Counter(), 0.0
    for t, dt, name, stack in samples:
        if name != thread or (until is not None and t > until) or t < since:
            continue
        total += dt
        for f in set(stack):
            inclusive[f] += dt
        own = [f for f in stack if not f.startswith(("<frozen", "threading.py", "runpy.py"))]
        exclusive[own[-1] if own else stack[-1]] += dt
    print(f"{thread}: {total:.2f} s sampled" + (f" (from {since:.2f} s up to {until:.2f} s)" if until else ""))
    print("inclusive (s):")
    for f, n in inclusive.most_common(top):
        print(f"  {n:8.2f}  {f}")
    print("innermost (s):")
    for f, n in exclusive.most_common(top // 2):
        print(f"  {n:8.2f}  {f}")


PHASES = [("holds_nonfinite", "weights' check"), ("verified", "waiting for the weights' check"), ("register_read_only", "locking weight files"),
          ("session.py:_decode", "decode step"), ("backend.py:_load", "backend load"), ("backend.py:prepare", "backend set-up"),
          ("_size_arena", "sizing the arena"), ("_compiled", "compile or plan read"), ("llama/graph.py:feed", "feeding the weights"),
          ("session.py:result", "waiting for the cache's pinning"), ("executor.py:run", "run"), ("load_model", "loading the model"),
          ("_find_and_load", "import")]
"""(a function on the stack, its phase), first match wins: `timeline`'s phases of a `turnip generate`."""


def timeline(samples, until: float, thread: str = "MainThread", shortest: float = 0.04) -> list[tuple[float, float, str]]:
    """The main thread's phases in order: (from, to, phase) spans of consecutive samples in one phase."""
    spans: list[tuple[float, float, str]] = []
    for t, _dt, name, stack in samples:
        if name != thread or t > until:
            continue
        phase = next((label for key, label in PHASES if any(key in frame for frame in stack)), "other: " + stack[-1])
        if spans and spans[-1][2] == phase:
            spans[-1] = (spans[-1][0], t, phase)
        else:
            spans.append((t, t, phase))
    return [span for span in spans if span[1] - span[0] >= shortest]


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] == "--timeline":  # a run's samples written before (--json), as phases
        with open(argv[1]) as handle:
            samples = json.load(handle)["samples"]
        for start, end, phase in timeline(samples, float("inf")):
            print(f"{start:7.2f} {end:7.2f} {end - start:6.2f}  {phase}")
        return 0
    if "--" not in argv:
        print("usage: sampled.py [--json OUT] [--every S] [--until S] -- (-m MODULE | SCRIPT) ARGS...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--every", type=float, default=0.01)
    parser.add_argument("--until", type=float, help="report only the samples up to S seconds")
    parser.add_argument("--since", type=float, default=0.0, help="report only the samples from S seconds")
    parser.add_argument("--threads", nargs="*", default=["MainThread"])
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1:]
    sampler = Sampler(args.every)
    sampler.start()
    code = 0
    sys.path.insert(0, ROOT)
    try:  # the `turnip` process ends at once after its command (os._exit): here it returns, to be reported
        from turnip_cli import process

        process.end = sys.exit
    except ImportError:
        pass
    try:
        if rest[0] == "-m":
            sys.argv = [rest[1], *rest[2:]]
            runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = rest
            runpy.run_path(rest[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sampler.stop.set()
        sampler.thread.join()
        wall = time.perf_counter() - sampler.began
        sys.stdout.flush()
        print(f"\n--- sampled: {wall:.2f} s wall, exit {code}")
        for thread in args.threads:
            report(sampler.samples, args.until, thread, since=args.since)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"wall_s": wall, "every": args.every, "samples": sampler.samples}, handle)
    return code


if __name__ == "__main__":
    sys.exit(main())
