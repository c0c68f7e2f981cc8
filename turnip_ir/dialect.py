"""The `turnip` xDSL dialect: taskgraphs and memgraphs as IR.

One op per vertex kind. Every op yields its tensor; an op that holds memory (a memgraph op, with a
`#turnip.loc<device, offset, size>` location or `#turnip.storage<offset, size>` CPU storage) also
yields an `!turnip.token`. Memory dependencies are token operands (`after [...]`), kept apart from
data operands as MLIR's async tokens are, and only memgraphs have them: a taskgraph op binds its tensor
alone (`%y = turnip.matmul %a, %b on 0 ...`). A memgraph adds `turnip.offload`/`turnip.reload`, and
may list `redundant [...]` memory edges that a data path already implies (drawn dashed, ignored at run
time). The kernel ops are generated from the kernel table, so a new kernel needs no new class.
Module-level rules that xDSL does not check (definition before use, device range, budget) live in
`turnip_ir.io.check_module`.
"""

from __future__ import annotations

import re
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    opt_result_def,
    param_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.irdl.declarative_assembly_format import (
    CustomDirective,
    ParsingState,
    PrintingState,
    TypeDirective,
    irdl_custom_directive,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from turnip_ir.errors import TurnipError
from turnip_ir.kernels import KERNELS, attribute_types, nbytes
from turnip_ir.limits import int_in_range, out_of_range

# ----- types and attributes -------------------------------------------------------------------------

ELEMENT_TYPES: dict[str, type[Attribute]] = {
    "float16": Float16Type,
    "bfloat16": BFloat16Type,
    "float32": Float32Type,
    "float64": Float64Type,
}


RAW_ELEMENT = IntegerType(8)
"""`tensor<Nxi8>` is an untyped memgraph tensor of N bytes: a hand-written memgraph that gives no shape."""


def tensor_type(shape, dtype: str | None, raw_bytes: int = 0) -> TensorType:
    """The IR type of a tensor; without a shape or dtype, `raw_bytes` untyped bytes."""
    if shape is None or dtype is None:
        return TensorType(RAW_ELEMENT, [raw_bytes])
    return TensorType(ELEMENT_TYPES[dtype](), list(shape))


def dtype_of(element: Attribute) -> str:
    for name, kind in ELEMENT_TYPES.items():
        if isinstance(element, kind):
            return name
    raise VerifyException(f"element type {element} is not one of {', '.join(ELEMENT_TYPES)}")


def shape_and_dtype(kind: Attribute) -> tuple[tuple[int, ...] | None, str | None]:
    """A tensor type's shape and dtype; (None, None) for an untyped `tensor<Nxi8>`."""
    assert isinstance(kind, TensorType)
    if kind.get_element_type() == RAW_ELEMENT:
        return None, None
    return tuple(kind.get_shape()), dtype_of(kind.get_element_type())


def type_bytes(kind: Attribute) -> int:
    """Bytes a tensor of this type needs (an untyped one: its N bytes)."""
    shape, dtype = shape_and_dtype(kind)
    if shape is None:
        return kind.get_shape()[0]
    return nbytes(shape, dtype)


@irdl_attr_definition
class TokenType(ParametrizedAttribute, TypeAttribute):
    """Completion of a vertex; memory-dependency operands have this type."""

    name = "turnip.token"


def _parse_ints(parser: AttrParser, count: int) -> list[IntAttr]:
    with parser.in_angle_brackets():
        values = [_parse_int(parser)]
        for _ in range(count - 1):
            parser.parse_punctuation(",")
            values.append(_parse_int(parser))
    return values


def _parse_int(parser: AttrParser) -> IntAttr:
    """One integer field, held to the bound JSON has too (turnip_ir/limits.py)."""
    start = parser.pos
    value = parser.parse_integer(allow_boolean=False)
    if not int_in_range(value):
        parser.raise_error(out_of_range(value), start, parser.pos)
    return IntAttr(value)


@irdl_attr_definition
class MemLocAttr(ParametrizedAttribute):
    """A region `[offset, offset + size)` of GPU `device`'s memory budget: `#turnip.loc<0, 4096, 1024>`."""

    name = "turnip.loc"
    device: IntAttr = param_def()
    offset: IntAttr = param_def()
    size: IntAttr = param_def()

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        return _parse_ints(parser, 3)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.device.data}, {self.offset.data}, {self.size.data}>")

    @staticmethod
    def get(device: int, offset: int, size: int) -> MemLocAttr:
        return MemLocAttr(IntAttr(device), IntAttr(offset), IntAttr(size))

    def verify(self) -> None:
        if min(self.device.data, self.offset.data, self.size.data) < 0:
            raise VerifyException(f"location {self} has a negative field")


@irdl_attr_definition
class StorageAttr(ParametrizedAttribute):
    """A region `[offset, offset + size)` of pinned CPU storage: `#turnip.storage<0, 1024>`."""

    name = "turnip.storage"
    offset: IntAttr = param_def()
    size: IntAttr = param_def()

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        return _parse_ints(parser, 2)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.offset.data}, {self.size.data}>")

    @staticmethod
    def get(offset: int, size: int) -> StorageAttr:
        return StorageAttr(IntAttr(offset), IntAttr(size))

    def verify(self) -> None:
        if min(self.offset.data, self.size.data) < 0:
            raise VerifyException(f"storage {self} has a negative field")


# ----- ops ------------------------------------------------------------------------------------------


class TokenParser(Parser):
    """xDSL's parser, noting how many values the op being parsed binds. Taskgraph text from before
    tokens were memgraph-only binds one on every op (`%y, %yt = turnip.matmul ... on 0`): `TokenIfHeld`
    reads the count so that such text still parses. The hook is xDSL 0.74's (pinned below 0.75)."""

    bound = 0

    def _parse_op_result_list(self):
        results = super()._parse_op_result_list()
        self.bound = sum(size for _, size in results)
        return results


@irdl_custom_directive
class TokenIfHeld(CustomDirective):
    """Writes nothing. When parsing, gives the op its token result if it holds memory (a location or
    storage), or if the text binds a second value (old taskgraph text, through a `TokenParser`)."""

    token: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        holds = "loc" in state.properties or "storage" in state.properties
        self.token.set(state, (TokenType(),) if holds or getattr(parser, "bound", 0) == 2 else ())

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        pass


_TOKEN = " custom<TokenIfHeld>(type($token))"


class TurnipOp(IRDLOperation):
    """Fields and checks every vertex op shares: its tensor and, in a memgraph, token results; placement;
    the task id where the value's name cannot say it (`task`); a memgraph node id where it is not the
    op's position among the vertex ops (`node`)."""

    result = result_def(TensorType)
    token = opt_result_def(TokenType)
    device = opt_prop_def(IntegerAttr[I64])
    loc = opt_prop_def(MemLocAttr)
    task = opt_prop_def(StringAttr)
    node = opt_prop_def(IntegerAttr[I64])
    custom_directives = (TokenIfHeld,)
    COPY: ClassVar[str | None] = None
    """'offload' or 'reload': the value's name is its task's with `.offloadN`/`.reloadN` appended."""

    def task_id(self) -> str | None:
        """The taskgraph id of the tensor this op makes or copies: its `task` property, else its value's
        name (without a copy's `.reloadN` or `.offloadN`); None for an unnamed value."""
        if self.task is not None:
            return self.task.data
        name = self.result.name_hint
        if name is not None and self.COPY is not None:
            return re.sub(rf"\.{self.COPY}\d+$", "", name)
        return name

    def label(self) -> str:
        task = self.task_id()
        return f"{self.name} '{task}'" if task else self.name

    def holds_memory(self) -> bool:
        """Whether the op has a location or CPU storage: a memgraph op, which yields a token."""
        return self.loc is not None or getattr(self, "storage", None) is not None

    def verify_placement(self) -> None:
        if self.holds_memory() and self.token is None:
            raise VerifyException(f"{self.label()}: an op with a location or storage yields a token too (list !turnip.token among its results)")
        shape, _ = shape_and_dtype(self.result.type)
        dims = tuple(shape) if shape is not None else tuple(self.result.type.get_shape())
        if any(d < 0 for d in dims):
            shown = "x".join("?" if d < -(1 << 40) else str(d) for d in dims)
            raise VerifyException(f"{self.label()}: dimension in {shown} is dynamic or negative (every tensor needs a static shape)")
        if self.device is not None and self.device.value.data < 0:
            raise VerifyException(f"{self.label()}: negative device {self.device.value.data}")
        if self.loc is not None:
            if self.device is not None and self.device.value.data != self.loc.device.data:
                raise VerifyException(f"{self.label()}: placed on {self.device.value.data} but its location is on {self.loc.device.data}")
            need = type_bytes(self.result.type)
            if self.loc.size.data < need:
                raise VerifyException(f"{self.label()}: location size {self.loc.size.data} is below the tensor's {need} bytes")


@irdl_op_definition
class InputOp(TurnipOp):
    """An input tensor, on a GPU (`on D` or `at` a location) or in CPU storage (`in #turnip.storage<...>`)."""

    name = "turnip.input"
    storage = opt_prop_def(StorageAttr)
    assembly_format = "(`on` $device^)? (`at` $loc^)? (`in` $storage^)? attr-dict `:` type($result)" + _TOKEN
    irdl_options = (ParsePropInAttrDict(),)

    def verify_(self) -> None:
        self.verify_placement()
        if self.loc is not None and self.storage is not None:
            raise VerifyException(f"{self.label()}: an input is either at a GPU location or in storage, not both")


class KernelOp(TurnipOp):
    """Base of the generated kernel ops (`turnip.matmul`, ...); `KERNEL` keys the kernel table."""

    KERNEL: ClassVar[str]
    ins = var_operand_def(TensorType)
    deps = var_operand_def(TokenType)
    redundant = var_operand_def(TokenType)
    assembly_format = (
        "$ins (`on` $device^)? (`at` $loc^)? (`after` `[` $deps^ `]`)? (`redundant` `[` $redundant^ `]`)?"
        " attr-dict `:` functional-type($ins, $result)" + _TOKEN
    )
    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())

    def kernel_attrs(self) -> dict:
        """The kernel attributes as Python values (str, float, int, bool), by name."""
        attrs = {}
        for name, kind in KERNELS[self.KERNEL].attrs.items():
            value = self.properties.get(name)
            if value is not None:
                attrs[name] = value.data if isinstance(value, StringAttr) else kind(value.value.data)
        return attrs

    def verify_(self) -> None:
        self.verify_placement()
        spec = KERNELS[self.KERNEL]
        for name in ATTRIBUTE_TYPES:
            value = self.properties.get(name)
            if value is not None and name not in spec.attrs:
                raise VerifyException(f"{self.label()}: {self.KERNEL} has no attribute '{name}'")
            if value is not None and not _fits(spec.attrs[name], value):
                form = _ATTRIBUTE_FORMS[spec.attrs[name]]
                raise VerifyException(f"{self.label()}: attribute '{name}' must be {form}, got {value}")
        operands = [shape_and_dtype(x.type) for x in self.ins]
        if any(shape is None for shape, _ in operands) or shape_and_dtype(self.result.type)[0] is None:
            return  # an untyped memgraph tensor: nothing to infer
        try:
            shape, dtype = spec.infer([s for s, _ in operands], [d for _, d in operands], self.kernel_attrs())
        except TurnipError as err:
            raise VerifyException(f"{self.label()}: {err}") from None
        if (shape, dtype) != shape_and_dtype(self.result.type):
            raise VerifyException(f"{self.label()}: result must be {tensor_type(shape, dtype)}, got {self.result.type}")


ATTRIBUTE_TYPES: dict[str, type] = attribute_types()
"""Every kernel op has each attribute of the kernel table as an optional property, of any attribute
type so that `verify_` can name the op and the attribute at fault; it also rejects the attributes its
kernel does not have. A new kernel attribute needs no edit here."""

_ATTRIBUTE_FORMS = {str: "a string", float: "a float", int: "an i64 integer", bool: "true or false"}


def _fits(kind: type, value: Attribute) -> bool:
    """Whether an IR attribute holds a kernel attribute of type `kind` (str, float, int, bool)."""
    if kind is str:
        return isinstance(value, StringAttr)
    if kind is float:
        return isinstance(value, FloatAttr)
    width = 1 if kind is bool else 64
    return isinstance(value, IntegerAttr) and value.type == IntegerType(width)


def _kernel_op(kernel_name: str) -> type[KernelOp]:
    class_name = "".join(part.capitalize() for part in kernel_name.split("_")) + "Op"
    fields = {"name": f"turnip.{kernel_name}", "KERNEL": kernel_name, "__module__": __name__, "__qualname__": class_name}
    fields.update({name: opt_prop_def(Attribute) for name in ATTRIBUTE_TYPES})
    fields["__annotations__"] = {"KERNEL": ClassVar[str]}
    fields["__doc__"] = f"Kernel `{kernel_name}`: {KERNELS[kernel_name].summary}."
    return irdl_op_definition(type(class_name, (KernelOp,), fields))


KERNEL_OPS: dict[str, type[KernelOp]] = {name: _kernel_op(name) for name in KERNELS}
globals().update({op.__name__: op for op in KERNEL_OPS.values()})


class _CopyOp(TurnipOp):
    """Base of ops that copy one tensor: the result has the operand's type."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    deps = var_operand_def(TokenType)
    redundant = var_operand_def(TokenType)
    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())

    def verify_(self) -> None:
        self.verify_placement()


_DEPS = "(`after` `[` $deps^ `]`)? (`redundant` `[` $redundant^ `]`)?"


@irdl_op_definition
class MoveOp(_CopyOp):
    """Copy a tensor from its GPU to GPU `device`: `turnip.move %x to 1`."""

    name = "turnip.move"
    device = prop_def(IntegerAttr[I64])
    assembly_format = f"$input `to` $device (`at` $loc^)? {_DEPS} attr-dict `:` type($input)" + _TOKEN


@irdl_op_definition
class OffloadOp(_CopyOp):
    """Copy a tensor from GPU `device` into CPU storage; the result stands for the stored copy."""

    name = "turnip.offload"
    COPY: ClassVar[str] = "offload"
    storage = prop_def(StorageAttr)
    assembly_format = f"$input (`on` $device^)? `to` $storage {_DEPS} attr-dict `:` type($input)" + _TOKEN

    def verify_(self) -> None:
        super().verify_()
        if self.loc is not None:
            raise VerifyException(f"{self.label()}: an offload writes storage, not a GPU location")


@irdl_op_definition
class ReloadOp(_CopyOp):
    """Copy a stored tensor (an offload, or an input in storage) back to a GPU location."""

    name = "turnip.reload"
    COPY: ClassVar[str] = "reload"
    loc = prop_def(MemLocAttr)
    assembly_format = f"$input `at` $loc {_DEPS} attr-dict `:` type($input)" + _TOKEN


@irdl_op_definition
class OutputOp(IRDLOperation):
    """The graph's outputs: these tensors must survive to the end of a run."""

    name = "turnip.output"
    values = var_operand_def(TensorType)
    assembly_format = "($values^ `:` type($values))? attr-dict"


VERTEX_OPS: tuple[type[TurnipOp], ...] = (InputOp, MoveOp, OffloadOp, ReloadOp, *KERNEL_OPS.values())

Turnip = Dialect("turnip", [*VERTEX_OPS, OutputOp], [TokenType, MemLocAttr, StorageAttr])
