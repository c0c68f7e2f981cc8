"""`turnip-opt`'s driver, a thin `xDSLOptMain` subclass; `turnip_cli/opt.py` imports it once Ctrl-C is guarded.

`turnip-opt FILE [-p PIPELINE] [--emit mlir|json|dot] [-o OUT] [--stats]`. FILE is `.mlir` or `.json`
(either format). Only the builtin and turnip dialects are registered, which keeps start-up short.
When every pass is a `GraphPass` (all of turnip's are) and no per-pass IR is asked for
(`--print-between-passes` and the like), the passes run in turn on one `Compilation` of the Python
graphs (passes/compilation.py) and IR is built only for `--emit mlir`, which saves xDSL's op
construction and verification per op (docs/benchmarks.md, "IR (foundation)"). Otherwise xDSL's own
driver runs the passes on the module, converting it for each pass.
Output is written only when everything succeeded (atomically), so a failed run leaves OUT untouched.
Exit codes: 0 ok, 1 bad input (syntax, fields, pipeline), 2 impossible budget, 3 verifier failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import sys
import time
from io import StringIO
from typing import IO

from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.universe import Universe
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError, VerifyException
from xdsl.xdsl_opt_main import xDSLOptMain

from passes.compilation import Compilation
from passes.graph_pass import GraphPass, cli_stats
from turnip_cli import interrupt
from turnip_ir.dialect import Turnip
from turnip_ir.errors import InputError, TurnipError
from turnip_ir.files import atomic_write, check_outputs
from turnip_ir.io import (
    Graph,
    check_module,
    graph_text,
    graph_to_module,
    lower_first,
    module_to_graph,
    module_text,
    parse_ir,
    parse_json,
)
from turnip_ir.limits import int_in_range, shorten
from turnip_ir.memgraph import MemGraph

EMITS = ("mlir", "json", "dot")
DESCRIPTION = "turnip-opt: compile taskgraphs (.json or .mlir) into memgraphs with turnip's passes"
EXAMPLE = """example:
  turnip-opt graph.json -p 'turnip-memgraph{budget=1048576 schedule=memory}' --emit json -o plan.json"""


def pass_help() -> str:
    """The epilog of `turnip-opt --help`: every registered pass with its options and defaults, and its summary."""
    from passes.registry import all_passes

    lines = ["passes (-p NAME{option=value ...}, joined by commas; docs/passes.md has the details):"]
    for name, factory in all_passes().items():
        cls = factory()
        options = " ".join(f"{field.name}={_default(field)}" for field in dataclasses.fields(cls) if field.init)
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        lines.append(f"  {name}{{{options}}}" if options else f"  {name}")
        lines.append(f"      {summary}")
    return "\n".join([*lines, "", EXAMPLE])


def _default(field: dataclasses.Field) -> str:
    value = field.default if field.default is not dataclasses.MISSING else "..."
    return '""' if value == "" else str(value)


class TurnipOptMain(xDSLOptMain):
    """xDSL's optimizer driver with turnip's dialect, passes, JSON frontend and json/dot targets.

    Only turnip's targets are offered (mlir, json, dot): xDSL's others (riscv-asm, wgsl, ...) cannot
    print a turnip module, so listing them would only mislead."""

    def __init__(self, description: str = DESCRIPTION, args: list[str] | None = None):
        self.help_asked = any(arg in ("-h", "--help") for arg in (sys.argv[1:] if args is None else args))
        super().__init__(description, args)

    def register_all_dialects(self) -> None:
        self.ctx.register_dialect("builtin", lambda: Builtin)
        self.ctx.register_dialect("turnip", lambda: Turnip)

    def register_all_frontends(self) -> None:
        def mlir(stream: IO[bytes]) -> ModuleOp:
            return parse_ir(stream.read().decode("utf-8", "replace"), self.get_input_name(), self.ctx)

        def json_graph(stream: IO[bytes]) -> ModuleOp:
            name = self.get_input_name()
            graph = parse_json(stream.read().decode("utf-8", "replace"), name)
            return _check_as_ir(graph, name)

        self.available_frontends["mlir"] = mlir
        self.available_frontends["json"] = json_graph

    def register_all_passes(self) -> None:
        from passes.registry import all_passes

        for name, factory in all_passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        self.available_targets["mlir"] = Universe.get_multiverse().all_targets["mlir"]
        self.available_targets["json"] = lambda module, out: out.write(_emit(module, "json"))
        self.available_targets["dot"] = lambda module, out: out.write(_emit(module, "dot"))

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.allow_abbrev = False  # an option is matched whole, never by a prefix (xDSL makes the parser)
        super().register_all_arguments(arg_parser)
        if self.help_asked:  # importing every pass for the list costs start-up, so only for --help
            arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
            arg_parser.epilog = pass_help()
        arg_parser.add_argument("--emit", choices=EMITS, default=None, help="output format (default mlir); same as -t")
        arg_parser.add_argument("--stats", action="store_true", help="print compile statistics (ops, offload bytes, edges, peak memory, time per pass)")

    def setup_pipeline(self) -> None:
        if self.args.emit is not None:
            self.args.target = self.args.emit
        super().setup_pipeline()
        for step in self.pipeline.passes:
            check_pass_options(step)

    def prepare_output(self) -> IO[str]:
        self.buffer = _Buffer()
        return self.buffer

    def apply_passes(self, prog: ModuleOp) -> None:
        super().apply_passes(prog)
        check_module(prog, self.get_input_name())

    def run(self) -> None:
        if not self._on_graphs():
            super().run()
            return
        state = Compilation(self._load(), cli_stats())
        for step in self.pipeline.passes:
            start = time.perf_counter()
            state.run(step)
            if self.args.time_passes:
                print(f"Pass {step.name} took {time.perf_counter() - start} seconds")
        self.buffer = _Buffer()
        self.buffer.write(_emit_graph(state.graph, self.args.target, self.args.print_op_generic))

    def _on_graphs(self) -> bool:
        """Whether the whole run can stay on the Python graphs (no per-pass IR is needed)."""
        args = self.args
        per_pass_ir = args.print_between_passes or args.split_input_file or args.verify_diagnostics
        printing = args.parsing_diagnostics or args.shrink or args.print_no_properties or args.print_debuginfo
        graph_passes = all(isinstance(step, GraphPass) for step in self.pipeline.passes)
        return graph_passes and args.target in EMITS and not (per_pass_ir or printing or args.syntax_highlight)

    def _load(self) -> Graph:
        stream, extension = self.get_input_stream()
        extension = self.args.frontend or extension
        with stream:
            text = stream.read().decode("utf-8", "replace")
        name = self.get_input_name()
        if extension == "json":
            graph = parse_json(text, name)
            if isinstance(graph, MemGraph):
                _check_as_ir(graph, name)
            return graph
        if extension == "mlir":
            return module_to_graph(parse_ir(text, name, self.ctx))
        raise ValueError(f"Unrecognized file extension '{extension}'")


def check_pass_options(step) -> None:
    """Every integer option of a pass below `INT_LIMIT` in magnitude, the bound every reader of a plan holds
    to: `budget=99999999999999999999999` would compile into a memgraph that `turnip run` refuses."""
    for field in dataclasses.fields(step):
        value = getattr(step, field.name)
        if isinstance(value, int) and not isinstance(value, bool) and not int_in_range(value):
            raise InputError(f"{step.name}: option {field.name}={shorten(str(value))} is out of range "
                             "(magnitude must stay below 2**62)")


class _Buffer(StringIO):
    """Collects the output; xDSL closes its output stream, but we write the file only on success."""

    def close(self) -> None:
        pass


def _check_as_ir(graph: Graph, name: str) -> ModuleOp:
    """The graph as a checked module: a memgraph's given shapes and types are checked here, file named."""
    try:
        module = graph_to_module(graph)
    except InputError as err:
        raise InputError(f"{name}: {err}") from None
    check_module(module, name)
    return module


def _emit(module: ModuleOp, emit: str) -> str:
    return _emit_graph(module_to_graph(module), emit)


def _emit_graph(graph: Graph, emit: str, generic: bool = False) -> str:
    if emit == "dot":
        from turnip_ir.dot import graph_dot

        return graph_dot(graph).source
    if emit == "mlir":
        return module_text(graph_to_module(graph), generic) + "\n"  # as xDSL's mlir target ends
    return graph_text(graph, "json")


def _fail(message: str, code: int) -> int:
    print(f"turnip-opt: error: {lower_first(message)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    from passes.compile_stats import collecting

    # A one-shot command: the graphs it reads, compiles and writes are millions of small acyclic objects,
    # freed by reference counts; the cyclic collector only rescans them (at 100k tasks, ~3 s of reading
    # and writing JSON). It stays off until the process ends.
    gc.disable()
    try:
        with interrupt.guard(), collecting() as stats:  # a Ctrl-C swallowed while compiling still stops it
            tool = TurnipOptMain(args=argv)
            check_outputs({"-o": tool.args.output_file}, {"FILE": tool.args.input_file})  # before compiling
            tool.run()
        text = tool.buffer.getvalue()
        if tool.args.output_file:
            atomic_write(tool.args.output_file, text)
        else:
            sys.stdout.write(text)
        if tool.args.stats:
            print(stats.table(), file=sys.stdout if tool.args.output_file else sys.stderr)
        return 0
    except TurnipError as err:
        return _fail(str(err), err.exit_code)
    except ParseError as err:
        where = err.span.get_location()
        return _fail(f"{where.name}:{where.line}:{where.col}: {err.msg}", 1)
    except (VerifyException, DiagnosticException) as err:
        return _fail(str(err).splitlines()[0] if str(err) else type(err).__name__, 1)
    except (ValueError, ArgSpecParseError) as err:
        return _fail(" ".join(str(err).split()), 1)
    except OSError as err:
        return _fail(f"{err.filename}: {err.strerror}", 1)
    except KeyboardInterrupt:
        print("turnip-opt: interrupted", file=sys.stderr)
        return 130
