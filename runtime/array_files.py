"""Arrays read from .npy and .npz files (token ids, a run's inputs), each header checked before its data.

`np.load` allocates what a header claims before it reads a byte of data: an .npy whose header says
(100000000000,) int64 asks for 745 GiB, and one inside an .npz the same. So `read_arrays` reads the
headers first (the .npy magic, or the zip directory and each member's .npy header) and refuses, in one
line naming the file and saying what was expected: a folder, a file that is neither format, Python
objects (pickled data), a header whose values are not all in the file, and arrays that together need
more host memory than is available. Only then does numpy read them. A damaged file numpy still refuses
is one line too, its reason shortened at a word (never cut mid-word).
"""

from __future__ import annotations

import math
import tokenize
import zipfile
from pathlib import Path
from typing import IO

import numpy as np

from runtime.host_memory import check_host_memory
from turnip_ir.errors import InputError
from turnip_ir.files import is_file, is_folder
from turnip_ir.limits import ECHO_CHARS, quoted

NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile)
"""What `np.load` raises on a damaged file: an .npy header is parsed as a Python literal, so a damaged one
raises SyntaxError or tokenize.TokenError, not only ValueError."""

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
"""How numpy tells an .npz (a zip file, possibly empty) from an .npy."""


def read_arrays(path: str | Path, what: str, expected: str) -> np.ndarray | dict[str, np.ndarray]:
    """The array of an .npy file, or the arrays of an .npz file by key in the file's order; else a one-line
    `InputError` naming `what` ("token ids file") and the file, and saying what was `expected`."""
    name = f"{what} '{path}'"
    if is_folder(path):
        raise InputError(f"{name} is a folder; expected {expected}")
    if not is_file(path):
        raise InputError(f"{name} does not exist")
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(NPY_MAGIC))
            handle.seek(0)
            packed = start.startswith(ZIP_MAGICS)
            if not packed and start != NPY_MAGIC:
                raise InputError(f"{name} is neither a .npy nor an .npz file; expected {expected}")
            need = _npz_bytes(handle, name, expected) if packed else _npy_bytes(handle, Path(path).stat().st_size, name, expected)
    except OSError as err:
        raise InputError(f"cannot read {name}: {err.strerror or err}") from None
    check_host_memory(need, f"the arrays of {name}", "give a smaller file")
    try:
        if not packed:
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except NUMPY_READ_ERRORS as err:
        raise InputError(f"{name} is not a readable {'.npz' if packed else '.npy'}: {_reason(err)}") from None


def _npz_bytes(handle: IO[bytes], name: str, expected: str) -> int:
    """The data bytes of every member of an .npz, each header checked (`_npy_bytes`)."""
    total = 0
    try:
        with zipfile.ZipFile(handle) as packed:
            for info in packed.infolist():
                key = info.filename.removesuffix(".npy")
                with packed.open(info) as member:
                    total += _npy_bytes(member, info.file_size, f"array {quoted(key)} of {name}", expected)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as err:  # NotImplementedError: a compression zipfile lacks
        raise InputError(f"{name} is not a readable .npz: {_reason(err)}") from None
    return total


def _npy_bytes(stream: IO[bytes], size: int, name: str, expected: str) -> int:
    """The data bytes an .npy's header says follow it, once checked: numbers, not Python objects, and all
    of them within the `size` bytes the file (or zip member) holds."""
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except NUMPY_READ_ERRORS as err:
        raise InputError(f"{name} is not a readable .npy: its header is damaged ({_reason(err)})") from None
    if any(n < 0 for n in shape):
        raise InputError(f"{name} is not a readable .npy: its header gives the shape {list(shape)}")
    if dtype.hasobject:
        raise InputError(f"{name} holds Python objects (pickled data), not numbers; expected {expected}")
    need = math.prod(shape) * dtype.itemsize
    held = size - stream.tell()
    if need > held:
        raise InputError(f"{name}: its header claims {math.prod(shape)} values of {dtype} ({need} bytes), "
                         f"the file holds {max(held, 0)} bytes of data")
    return need


def _reason(err: BaseException) -> str:
    """numpy's (or zipfile's) message on one line, cut at a word with an ellipsis when long."""
    text = " ".join(str(err).split()) or type(err).__name__
    if len(text) <= 2 * ECHO_CHARS:
        return text
    return text[: 2 * ECHO_CHARS].rsplit(" ", 1)[0] + " ..."
