"""Loading and saving graphs: `.json` (either format) and `.mlir` (the dialect), with one-line errors.

Every problem becomes an `InputError` whose message starts with `file:line:col:` where a position is
known (JSON syntax, IR syntax, IR verification) and otherwise names the node. `check_module` adds
what xDSL does not check: values defined before use (hence no cycle), device indices, locations
inside the budget.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp, TensorType
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from turnip_ir.convert import (
    BUDGET_ATTR,
    DEVICES_ATTR,
    is_memgraph,
    module_devices,
    memgraph_from_ir,
    memgraph_to_ir,
    taskgraph_from_ir,
    taskgraph_to_ir,
)
from turnip_ir.dialect import TokenParser, Turnip, TurnipOp
from turnip_ir.errors import InputError
from turnip_ir.json_memgraph import memgraph_from_json
from turnip_ir.json_taskgraph import taskgraph_from_json
from turnip_ir.limits import ECHO_CHARS, MAX_NESTING, MAX_RANK, digits_message, int_in_range, json_document, out_of_range, shorten
from turnip_ir.memgraph import MEMGRAPH_FORMAT, MemGraph
from turnip_ir.taskgraph import TASKGRAPH_FORMAT, TaskGraph

Graph = TaskGraph | MemGraph


def context() -> Context:
    """An xDSL context with builtin and turnip loaded (and nothing else, for fast start-up)."""
    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(Turnip)
    return ctx


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err.__class__.__name__}") from None


def _op_lines(text: str) -> list[str]:
    """`line:col` (1-based) of each op's first character, in order (one op per line in the custom format)."""
    op_line = re.compile(r'\s*(%[^=]*=\s*)?"?turnip\.')
    starts = []
    for number, line in enumerate(text.splitlines(), 1):
        if op_line.match(line):
            starts.append(f"{number}:{len(line) - len(line.lstrip()) + 1}")
    return starts


def _check_strings(text: str, name: str) -> None:
    """Reject a string literal left open at the end of its line, before xDSL's lexer sees it.

    xDSL 0.74 matches string literals with a nested-quantifier regex that backtracks exponentially when
    the closing quote is missing: a stray `"` followed by ~35 characters hangs the parser for minutes.
    MLIR strings never span lines, so a per-line scan finds the same error in linear time.
    """
    for number, line in enumerate(text.splitlines(), start=1):
        opened, i = None, 0
        while i < len(line):
            char = line[i]
            if opened is not None:
                if char == "\\":
                    i += 1
                elif char == '"':
                    opened = None
            elif char == '"':
                opened = i
            elif line.startswith("//", i):
                break
            i += 1
        if opened is not None:
            raise InputError(f"{name}:{number}:{opened + 1}: string literal is not closed on its line")


def _check_ranks(text: str, name: str) -> None:
    """Reject a `tensor<...>` of more than `MAX_RANK` dimensions before xDSL parses it in quadratic time."""
    start = text.find("tensor<")
    while start != -1:
        end = text.find(">", start)
        end = len(text) if end == -1 else end
        rank = text.count("x", start, end)  # `16x16xf32` has 2 dimensions and 2 `x`
        if rank > MAX_RANK:
            raise InputError(f"{name}:{_line_col(text, start)}: tensor type has {rank} dimensions, more than the {MAX_RANK} allowed")
        start = text.find("tensor<", end)


def _check_nesting(text: str, name: str) -> None:
    """Reject brackets nested deeper than `MAX_NESTING`, before xDSL's recursive descent overflows on them.

    String literals and comments are blanked first (same length, so positions hold)."""
    code = re.sub(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*', lambda m: " " * len(m.group()), text)
    depth = 0
    for match in re.finditer(r"[\[\](){}<>]", code):
        char = match.group()
        if char in "[({<":
            depth += 1
            if depth > MAX_NESTING:
                raise InputError(f"{name}:{_line_col(text, match.start())}: brackets nest more than {MAX_NESTING} deep")
        elif char != ">" or code[match.start() - 1] != "-":  # `->` in function types closes nothing
            depth = max(depth - 1, 0)


def _line_col(text: str, pos: int) -> str:
    return f"{text.count(chr(10), 0, pos) + 1}:{pos - text.rfind(chr(10), 0, pos)}"


def parse_ir(text: str, name: str = "<input>", ctx: Context | None = None) -> ModuleOp:
    """Parse and fully check turnip IR; errors are `InputError('name:line:col: message')`."""
    _check_strings(text, name)
    _check_ranks(text, name)
    _check_nesting(text, name)
    parser = None
    try:
        parser = TokenParser(ctx or context(), text, name)  # lexes the first token already
        module = parser.parse_module()
    except ParseError as err:
        where = err.span.get_location()
        raise InputError(f"{name}:{where.line}:{where.col}: {_short_tokens(_parse_message(err.msg, text, where.line))}") from None
    except (VerifyException, ValueError, RecursionError) as err:
        # xDSL checks attributes and format constraints while parsing, without a span: use its position
        pos = parser.pos if parser is not None else 0
        message = "nested too deep" if isinstance(err, RecursionError) else digits_message(" ".join(str(err).split()))
        raise InputError(f"{name}:{_line_col(text, pos)}: {_short_tokens(lower_first(message))}") from None
    check_module(module, name, text)
    return module


def _short_tokens(message: str) -> str:
    """The message with any long run of input text it echoes (a type, an attribute) shortened."""
    return re.sub(rf"\S{{{ECHO_CHARS + 1},}}", lambda m: shorten(m.group()), message)


def _parse_message(message: str, text: str, line: int) -> str:
    """xDSL's message, with the fix spelled out where a memgraph op binds only its tensor."""
    if re.match(r"Operation has 2 results, but was given 1 to bind", message):
        op = re.search(r"(%[^\s=,]+)\s*=\s*(turnip\.\w+)", text.splitlines()[line - 1])
        value, name = op.groups() if op else ("%y", "turnip.op")
        return f"{name} {value} has a location or storage, so it yields a token too: bind both (`{value}, {value}t = ...`)"
    return lower_first(message)


def lower_first(message: str) -> str:
    """A diagnostic starts lowercase (style), whatever the library that raised it wrote."""
    return message[:1].lower() + message[1:]


def check_module(module: ModuleOp, name: str = "<input>", text: str | None = None) -> None:
    """Verify ops (xDSL) plus order, devices and budget; raise `InputError` at the offending op."""
    lines = _op_lines(text) if text is not None else []
    at_module = _module_where(text, name)
    devices = _int_attr(module, DEVICES_ATTR, at_module) if DEVICES_ATTR in module.attributes else module_devices(module)
    budget = _int_attr(module, BUDGET_ATTR, at_module) if BUDGET_ATTR in module.attributes else None
    seen: set = set()
    for index, op in enumerate(module.ops):
        where = f"{name}:{lines[index]}" if index < len(lines) else name
        try:
            op.verify()
        except VerifyException as err:
            raise InputError(f"{where}: {_short_tokens(' '.join(str(err).split()))}") from None
        for operand in op.operands:
            if operand.owner not in seen:
                raise InputError(f"{where}: {_label(op)} uses {_value_name(operand)} before its definition (order or cycle)")
        _check_dims(op, where)
        if isinstance(op, TurnipOp):
            _check_place(op, devices, budget, where)
        seen.add(op)


def _check_dims(op, where: str) -> None:
    """Tensor dimensions stay below `INT_LIMIT`, as JSON shapes must (xDSL takes any integer)."""
    for result in op.results:
        if isinstance(result.type, TensorType):
            for dim in result.type.get_shape():
                if not int_in_range(dim):
                    raise InputError(f"{where}: {_label(op)} result type has a dimension out of range: {out_of_range(dim)}")


def _module_where(text: str | None, name: str) -> str:
    """`name:line:1` of the module's first line, for errors in its attributes."""
    for number, line in enumerate((text or "").splitlines(), 1):
        if re.match(r'\s*"?builtin\.module', line):
            return f"{name}:{number}:1"
    return name


def _label(op) -> str:
    return op.label() if isinstance(op, TurnipOp) else op.name


def _value_name(value) -> str:
    return f"%{value.name_hint}" if value.name_hint else "a value"


def _int_attr(module: ModuleOp, attr: str, name: str) -> int:
    from xdsl.dialects.builtin import IntegerAttr

    value = module.attributes.get(attr)
    if not isinstance(value, IntegerAttr) or not int_in_range(value.value.data) or value.value.data < (1 if attr == DEVICES_ATTR else 0):
        raise InputError(f"{name}: the module needs attributes {{{attr} = N : i64}} with N a positive integer below 2**62")
    return value.value.data


def _check_place(op: TurnipOp, devices: int, budget: int | None, where: str) -> None:
    device = op.loc.device.data if op.loc is not None else op.device.value.data if op.device is not None else None
    if device is not None and device >= devices:
        raise InputError(f"{where}: {op.label()} is on device {device}, but the module has {devices} devices")
    if op.loc is not None and budget is not None and op.loc.offset.data + op.loc.size.data > budget:
        raise InputError(f"{where}: {op.label()} location {_region(op.loc)} ends past the budget of {budget} bytes")


def _region(loc) -> str:
    return f"[{loc.offset.data}, {loc.offset.data + loc.size.data})"


def module_text(module: ModuleOp, generic: bool = False) -> str:
    from io import StringIO

    out = StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    out.write("\n")
    return out.getvalue()


# ----- whole files -------------------------------------------------------------------------------------


TRACE_KEY = "traceEvents"
"""The key of a run's Chrome/Perfetto trace (`turnip run --trace`), which no graph has."""


def is_trace(path: str | Path) -> bool:
    """Whether `path` looks like a run trace, judged from its first 4 KiB (a trace can be large)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return f'"{TRACE_KEY}"'.encode() in head


def parse_json(text: str, name: str = "<input>") -> Graph:
    """A taskgraph or memgraph from JSON text, with the cyclic garbage collector paused meanwhile."""
    with _no_cycle_collection():
        return _parse_json(text, name)


@contextmanager
def _no_cycle_collection():
    """Pause Python's cyclic collector: reading a graph allocates millions of dicts, lists and tuples in
    no cycle, and each collection it triggers walks every object alive in the process (on a 9 MB file,
    up to half the read). Reference counting still frees everything; the collector resumes after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_json(text: str, name: str) -> Graph:
    doc = json_document(text, name, allow_nan=True)
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if fmt is None and isinstance(doc, dict) and TRACE_KEY in doc:
        raise InputError(f"{name} is a run trace, not a taskgraph or memgraph: view it with turnip viz")
    try:
        if fmt == MEMGRAPH_FORMAT:
            return memgraph_from_json(doc)
        if fmt == TASKGRAPH_FORMAT:
            return taskgraph_from_json(doc)
    except InputError as err:
        raise InputError(f"{name}: {err}") from None
    raise InputError(f"{name}: field 'format' must be '{TASKGRAPH_FORMAT}' or '{MEMGRAPH_FORMAT}', got {fmt!r}")


def module_to_graph(module: ModuleOp) -> Graph:
    return memgraph_from_ir(module) if is_memgraph(module) else taskgraph_from_ir(module)


def graph_to_module(graph: Graph) -> ModuleOp:
    return memgraph_to_ir(graph) if isinstance(graph, MemGraph) else taskgraph_to_ir(graph)


def load_graph(path: str | Path) -> Graph:
    """A taskgraph or memgraph from `.json` or `.mlir` (any other suffix is read as IR)."""
    text = _read(path)
    if str(path).endswith(".json"):
        return parse_json(text, str(path))
    module = parse_ir(text, str(path))
    try:
        return module_to_graph(module)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


def load_taskgraph(path: str | Path) -> TaskGraph:
    graph = load_graph(path)
    if not isinstance(graph, TaskGraph):
        raise InputError(f"{path}: expected a taskgraph, found a memgraph")
    return graph


def load_memgraph(path: str | Path) -> MemGraph:
    graph = load_graph(path)
    if not isinstance(graph, MemGraph):
        raise InputError(f"{path}: expected a memgraph, found a taskgraph")
    return graph


def graph_text(graph: Graph, emit: str) -> str:
    """`graph` as `json` or `mlir` text."""
    if emit == "json":
        return graph.dumps() if isinstance(graph, MemGraph) else graph.dumps() + "\n"
    return module_text(graph_to_module(graph))
