"""Safetensors files, read lazily and written, without the `safetensors` package.

The format: an 8-byte little-endian header length N, N bytes of JSON header, then raw little-endian
data. The header maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets
into the data that follows the header) and may hold `"__metadata__"`, a str -> str map. A sharded
checkpoint is a `model.safetensors.index.json` whose `weight_map` names each tensor's file.

`SafeTensors.open(path)` reads the headers only; each file is mapped once (`mmap`, one read-only array
over it), and a tensor is a read-only view into that map, so weights are never copied unless a
conversion is asked for.
`read_into(name, out)` is the loading path: one pass over the map that copies (and converts, where
`out`'s dtype differs) a tensor or a block of it straight into a caller's buffer (pinned host storage),
chunk by chunk, each chunk's pages released from this process once copied (they stay in the page
cache), so a loaded checkpoint is held once, in the buffers, and not a second time as mapped pages.
Threads may read tensors in parallel: numpy's copies release the GIL. BF16
is `ml_dtypes.bfloat16` (the top 16 bits of a float32; the numpy bfloat16 JAX uses): asked for as
bfloat16 it is a view like any other, with no dtype it comes back as float32 (exactly), or in a requested
dtype; ml_dtypes rounds float32 to bfloat16 to nearest even, as torch does. Every problem is a one-line `InputError` naming the file and, where there is one, the tensor;
a file's bytes are never echoed. Headers are checked as the format specifies: each range holds exactly
its dtype and shape, and sorted by offset the ranges tile the data section with no overlap, gap or
trailing bytes. A folder's files and an index's shards follow the model folder rule
(frontend/model_folder.py): inside the folder, or in its Hugging Face cache repository's blobs.
`save_file` and `save_sharded` write the format, for tests and for converting random weights; `file_contents`
is what `save_file` writes, for a caller writing several files together (a LoRA adapter folder).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from frontend.lazy import LazyTensor
from frontend.model_folder import check_folder, model_file
from turnip_ir.errors import InputError
from turnip_ir.files import atomic_write, is_file, is_folder
from turnip_ir.kernels import numpy_dtype
from turnip_ir.limits import json_document, quoted, shorten

FORMATS: dict[str, tuple[str, str]] = {
    "F16": ("float16", "<f2"),
    "BF16": ("bfloat16", "bfloat16"),
    "F32": ("float32", "<f4"),
    "F64": ("float64", "<f8"),
    "I32": ("int32", "<i4"),
    "I64": ("int64", "<i8"),
}
"""Safetensors dtype code -> (its name here, the stored element type: `stored_dtype`)."""


def stored_dtype(code: str) -> np.dtype:
    """The numpy element type a safetensors dtype code is stored as. BF16 is `ml_dtypes.bfloat16`,
    imported at its first use: the import takes 0.6 s on a 2-core VM, which every command paid at its
    start, float16 or not."""
    name, spec = FORMATS[code]
    return numpy_dtype(name) if code == "BF16" else np.dtype(spec)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_LIMIT = 100 << 20
"""The format caps the JSON header at 100 MB; a larger length means a corrupt or foreign file."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, stored dtype code, shape, and byte range in the file."""

    name: str
    file: Path
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafeTensors:
    """The tensors of one safetensors file or a sharded index, by name: `names()`, `shape`, `dtype`,
    `get`; also `st[name]` (= `st.get(name)`), `name in st`, `len(st)` and iteration over the names.
    Not a `Mapping`: `get` raises on a missing name and takes a dtype, where `Mapping.get` has a default."""

    def __init__(self, source: Path, entries: dict[str, TensorEntry], metadata: dict[str, str]):
        self.source = source
        self.metadata = metadata
        self._entries = entries
        self._maps: dict[Path, tuple[mmap.mmap, np.ndarray]] = {}

    @classmethod
    def open(cls, path: str | Path) -> SafeTensors:
        """A `.safetensors` file, a `model.safetensors.index.json`, or a folder holding either."""
        path = Path(path)
        if is_folder(path):
            check_folder(path)
            path = _model_file(path)
        if not is_file(path):
            raise InputError(f"safetensors file '{path}' does not exist")
        if path.name.endswith(".json"):
            return cls(path, *_read_index(path))
        entries, metadata = read_header(path)
        return cls(path, entries, metadata)

    # ----- queries ----------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    keys = names

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def dtype(self, name: str) -> str:
        """The stored dtype: float16, bfloat16, float32, float64, int32 or int64."""
        return FORMATS[self._entry(name).code][0]

    def file(self, name: str) -> Path:
        return self._entry(name).file

    def __getitem__(self, name: str) -> np.ndarray:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    # ----- reading ----------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The stored tensor as a read-only view of the mapped file (BF16 as ml_dtypes.bfloat16), no copy."""
        entry = self._entry(name)
        data = self._map(entry.file)[1][entry.begin : entry.end]
        return data.view(stored_dtype(entry.code)).reshape(entry.shape)

    def get(self, name: str, dtype: str | np.dtype | None = None, shape=None) -> np.ndarray:
        """The tensor, converted to `dtype` when it differs (a copy), else as stored (a view; with no dtype
        BF16 comes back as float32, since numpy computes on bfloat16 slowly).

        With `shape`, a tensor of another shape is an error naming the expected and found shapes.
        """
        entry = self._entry(name)
        if shape is not None and tuple(shape) != entry.shape:
            raise InputError(
                f"tensor {quoted(name)} in '{entry.file}': expected shape {list(shape)}, found {list(entry.shape)}"
            )
        array = self.raw(name)
        if dtype is None and entry.code == "BF16":
            dtype = np.float32
        if dtype is not None and np.dtype(dtype) != array.dtype:
            with np.errstate(over="ignore"):  # an overflow to float16 is reported by name below
                converted = array.astype(dtype)
            _check_range(entry, array, converted)
            return converted
        return array

    def read_into(self, name: str, out: np.ndarray, index: tuple[slice, ...] = ()) -> None:
        """Copy tensor `name` (or its block `index`, slices of its leading axes) into `out`, converting to
        `out`'s dtype in the same pass where it differs; a narrowing that overflows float16 is an
        `InputError` naming the tensor (as `get`). Copies rows in chunks of about `READ_CHUNK` bytes
        and releases each chunk's mapped pages once copied."""
        entry = self._entry(name)
        source = self.raw(name)[index]
        if source.shape != out.shape:
            raise InputError(f"tensor {quoted(name)} in '{entry.file}': a block of shape {list(source.shape)} cannot fill "
                             f"a buffer of shape {list(out.shape)}")
        if source.ndim == 0 or source.size == 0:
            _copy_checked(entry, source, out)
            return
        handle, base = self._map(entry.file)
        rows = max(1, READ_CHUNK // max(1, source[0].nbytes))
        for start in range(0, source.shape[0], rows):
            chunk = source[start : start + rows]
            _copy_checked(entry, chunk, out[start : start + rows])
            _release(handle, base, chunk)

    def read_rows(self, name: str, ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Rows `ids` of tensor `name` (an embedding lookup) in `dtype`, checked as `read_into` checks; the
        table's mapped pages are released after, so only the rows are held."""
        entry = self._entry(name)
        table = self.raw(name)
        out = np.empty((len(ids), *entry.shape[1:]), dtype)
        _copy_checked(entry, table[ids], out)
        handle, base = self._map(entry.file)
        _release(handle, base, table)
        return out

    def mapped_block(self, name: str, dtype: np.dtype, index: tuple[slice, ...] = ()) -> tuple[np.ndarray, np.ndarray] | None:
        """(view, mapping): block `index` of tensor `name` as a read-only view of the mapped file, and the
        file's whole map (uint8) it lies in, when it is stored in `dtype` (no conversion) and the block is
        contiguous in the file; else None (runtime.inputs.mapped)."""
        entry = self._entry(name)
        if stored_dtype(entry.code) != np.dtype(dtype):
            return None
        view = self.raw(name)[index]
        if view.size == 0 or not view.flags.c_contiguous:
            return None
        return view, self._map(entry.file)[1]

    def lazy(self, name: str, dtype: str | np.dtype | None = None) -> StoredTensor:
        """Tensor `name` in `dtype` (default: as stored), read only when written into a buffer."""
        entry = self._entry(name)
        return StoredTensor(self, name, np.dtype(dtype or stored_dtype(entry.code)), entry.shape)

    def _entry(self, name: str) -> TensorEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise InputError(f"tensor {quoted(name)} is not in '{self.source}'")
        return entry

    def _map(self, file: Path) -> tuple[mmap.mmap, np.ndarray]:
        """The file's map and a read-only uint8 array over all of it (made once; threads share them). A plain
        ndarray, not an `np.memmap`: every view of a memmap is a memmap whose `__array_finalize__` runs in
        Python (3.7 against 0.66 us a block's view), and a 7b load takes thousands of views, on threads that
        share the GIL with the main thread's set-up (0.8 s sampled on the H100 host)."""
        if file not in self._maps:
            try:
                with open(file, "rb") as handle:
                    mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as err:
                raise InputError(f"cannot map safetensors file '{file}': {err}") from None
            self._maps.setdefault(file, (mapping, np.frombuffer(mapping, dtype=np.uint8)))  # never closed: views outlive it
        return self._maps[file]


class StoredTensor(LazyTensor):
    """A tensor of a safetensors file, or a block of one, in `dtype` (frontend/lazy.py): it reads itself
    into the buffer it is given (`SafeTensors.read_into`)."""

    def __init__(self, file: SafeTensors, name: str, dtype: np.dtype, stored_shape: tuple[int, ...]):
        super().__init__(stored_shape, dtype)
        self.file, self.name = file, name

    def write_into(self, out: np.ndarray) -> None:
        self.file.read_into(self.name, out, self.index)

    def mapped(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The block where it lies in the mapped file, when no conversion is needed (SafeTensors.mapped_block)."""
        return self.file.mapped_block(self.name, self.dtype, self.index)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids`, gathered from the map in one step and converted; their pages released after."""
        return self.file.read_rows(self.name, ids, self.dtype)


READ_CHUNK = 16 << 20
"""Bytes `read_into` copies between two releases of mapped pages: small enough that a load never holds
much of the file mapped, large enough that the calls cost nothing beside the copy."""


def _copy_checked(entry: TensorEntry, source: np.ndarray, out: np.ndarray) -> None:
    """`out[...] = source`, converted; a float16 overflow names the tensor (as `SafeTensors.get`)."""
    with np.errstate(over="ignore"):
        np.copyto(out, source, casting="unsafe")
    if out.dtype != source.dtype:
        _check_range(entry, source, out)


def _release(handle: mmap.mmap, base: np.ndarray, chunk: np.ndarray) -> None:
    """Drop the mapped pages under `chunk` (a view of `base`, the map's uint8 view) from this process:
    MADV_DONTNEED on a read-only file map leaves them in the page cache and a later read maps them again,
    so they do not count in the process's resident memory. Whole pages: a neighbour's pages dropped too
    are read back in where needed, never lost."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    low = chunk.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    high = low + sum((n - 1) * s for n, s in zip(chunk.shape, chunk.strides)) + chunk.itemsize
    first = low // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(len(handle), high)
    if end > first:
        handle.madvise(mmap.MADV_DONTNEED, first, end - first)


def _check_range(entry: TensorEntry, stored: np.ndarray, converted: np.ndarray) -> None:
    """A narrowing to float16 whose values overflow it (|x| > 65504, bfloat16 and float32 checkpoints
    can hold them) is an error naming the tensor, never silent infinities in the weights."""
    if converted.dtype != np.float16 or stored.dtype.itemsize < 2 or stored.dtype == np.float16:
        return
    overflow = np.isinf(converted) & np.isfinite(stored)
    if overflow.any():
        largest = float(np.abs(stored[overflow].astype(np.float32)).max())
        raise InputError(f"tensor {quoted(entry.name)} in '{entry.file}': values up to {largest:.4g} overflow float16 "
                         f"(largest {float(np.finfo(np.float16).max):g}); run it in bfloat16 or float32 (--dtype)")


# ----- reading headers -------------------------------------------------------------------------------------


def _model_file(folder: Path) -> Path:
    for name in (INDEX_FILE, SINGLE_FILE):
        path = model_file(folder, name, "weights file")
        if is_file(path):
            return path
    raise InputError(f"folder '{folder}' has neither {SINGLE_FILE} nor {INDEX_FILE}")


def read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The tensors of one file (offsets made absolute) and its `__metadata__`; checks every entry."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise InputError(f"safetensors file '{path}' is shorter than its 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(HEADER_LIMIT, size - 8):  # the 8 bytes may be anything: never echo them
            raise InputError(f"'{path}' is not a safetensors file (its header length runs past the end of the file)")
        text = handle.read(length)
    try:
        header = json_document(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"'{path}' is not a safetensors file (its header is not UTF-8 JSON)") from None
    except InputError as err:  # the message names a position, never the text
        raise InputError(f"safetensors file '{path}': malformed header: {err}") from None
    if not isinstance(header, dict):
        raise InputError(f"safetensors file '{path}': malformed header: not a JSON object")
    metadata = _metadata(header.pop("__metadata__", {}), path)
    start = 8 + length
    entries = {name: _entry(name, raw, path, start, size) for name, raw in header.items()}
    _check_tiling(entries, path, start, size)
    return entries, metadata


def _check_tiling(entries: dict[str, TensorEntry], path: Path, start: int, size: int) -> None:
    """As the format requires: sorted by offset, the tensors' byte ranges cover the data section exactly,
    with no overlap (two weights sharing bytes), no gap, and no trailing bytes after the last one."""
    end, previous = start, None
    for entry in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        offsets = [entry.begin - start, entry.end - start]
        if entry.begin < end:
            raise InputError(f"tensor {quoted(entry.name)} in '{path}': data_offsets {offsets} overlap tensor {quoted(previous)}")
        if entry.begin > end:
            raise InputError(f"tensor {quoted(entry.name)} in '{path}': data_offsets {offsets} leave a gap of "
                             f"{entry.begin - end} bytes before them")
        end, previous = entry.end, entry.name
    if end != size:
        raise InputError(f"safetensors file '{path}': {size - end} trailing bytes after the last tensor's data")


def _metadata(raw, path: Path) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise InputError(f"safetensors file '{path}': malformed header: __metadata__ must map strings to strings")
    return raw


def _entry(name: str, raw, path: Path, start: int, size: int) -> TensorEntry:
    where = f"tensor {quoted(name)} in '{path}'"
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise InputError(f"{where}: malformed header entry (needs exactly dtype, shape, data_offsets)")
    code, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(code, str) or code not in FORMATS:
        raise InputError(f"{where}: dtype {str(code)[:20]!r} is not supported (supported: {', '.join(FORMATS)})")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise InputError(f"{where}: malformed header: shape {shorten(repr(shape))} must be a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(o) for o in offsets):
        raise InputError(f"{where}: malformed header: data_offsets {shorten(repr(offsets))} must be [begin, end]")
    begin, end = offsets
    need = math.prod(shape) * stored_dtype(code).itemsize
    if end - begin != need:
        raise InputError(f"{where}: data_offsets {offsets} hold {end - begin} bytes, its {code} shape {shape} needs {need}")
    if start + end > size:
        raise InputError(f"{where}: data_offsets {offsets} run past the end of the file (data section of {size - start} bytes)")
    return TensorEntry(name, path, code, tuple(shape), start + begin, start + end)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shard(index: Path, file_name: str) -> Path:
    """The shard `file_name` of `index`: a file of the index's folder by the model folder rule
    (frontend/model_folder.py), so an index cannot make the reader open `../../x`, an absolute path, or a
    link out of the folder, while a Hugging Face cache snapshot's links into its blobs are read."""
    shard = model_file(index.parent, file_name, f"safetensors index '{index}': shard")
    if not is_file(shard):
        raise InputError(f"safetensors index '{index}': shard {quoted(file_name)} does not exist")
    return shard


def _read_index(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The tensors of every shard an index's `weight_map` names; each must be in the file it is mapped to."""
    try:
        index = json_document(path.read_text())
    except (UnicodeDecodeError, InputError) as err:
        raise InputError(f"safetensors index '{path}' is not valid JSON: {err}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"safetensors index '{path}' needs a 'weight_map' of tensor name -> file name")
    shards: dict[str, dict[str, TensorEntry]] = {}
    entries: dict[str, TensorEntry] = {}
    for name, file_name in weight_map.items():
        if file_name not in shards:
            shards[file_name] = read_header(_shard(path, file_name))[0]
        if name not in shards[file_name]:
            raise InputError(f"tensor {quoted(name)} is not in {str(path.parent / file_name)!r} (the index '{path}' maps it there)")
        entries[name] = shards[file_name][name]
    metadata = index.get("metadata") or {}
    return entries, {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}


# ----- writing -----------------------------------------------------------------------------------------------

CODES = {(np.dtype(spec).kind, np.dtype(spec).itemsize): code for code, (_, spec) in FORMATS.items() if code != "BF16"}
"""(numpy kind, itemsize) -> the dtype code an array of that type is written as."""


def save_file(
    tensors: Mapping[str, np.ndarray],
    path: str | Path,
    metadata: Mapping[str, str] | None = None,
    bfloat16: tuple[str, ...] = (),
) -> int:
    """Write `tensors` (in name order) to one safetensors file, via a temporary file; returns the data bytes.

    float16, bfloat16 (ml_dtypes), float32, float64, int32 and int64 arrays are stored as such; names in
    `bfloat16` (float arrays, rounded to float32 first) are stored as BF16, rounded to nearest even.
    """
    write, size = file_contents(tensors, path, metadata, bfloat16)
    atomic_write(path, write)
    return size


def file_contents(
    tensors: Mapping[str, np.ndarray],
    path: str | Path,
    metadata: Mapping[str, str] | None = None,
    bfloat16: tuple[str, ...] = (),
) -> tuple[Callable[[BinaryIO], None], int]:
    """What `save_file` writes to `path`, as a function writing it into a file handle (for
    turnip_ir/files.py `write_all`, with other files), and the data bytes."""
    target = Path(path)
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    if metadata and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InputError(f"safetensors file '{target}': metadata must map strings to strings")
    blobs = []
    offset = 0
    for name in sorted(tensors):
        code, data = _stored(name, tensors[name], name in bfloat16, target)
        header[name] = {"dtype": code, "shape": list(data.shape), "data_offsets": [offset, offset + data.nbytes]}
        blobs.append(data)
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned, as the reference writer does
    head = struct.pack("<Q", len(text)) + text

    def write(handle: BinaryIO) -> None:
        handle.write(head)
        for blob in blobs:
            handle.write(memoryview(blob.reshape(-1).view(np.uint8)))  # bytes: bfloat16 has no buffer format

    return write, offset


def _stored(name: str, array, as_bfloat16: bool, target: Path) -> tuple[str, np.ndarray]:
    array = np.asarray(array)
    if as_bfloat16:
        if array.dtype.kind != "f":
            raise InputError(f"tensor {quoted(name)} for '{target}': only a float array can be stored as BF16, not {array.dtype}")
        return "BF16", np.asarray(array, np.float32).astype(stored_dtype("BF16"), order="C")  # 0-d stays 0-d
    code = "BF16" if array.dtype.name == "bfloat16" else CODES.get((array.dtype.kind, array.dtype.itemsize))
    if code is None:
        known = ", ".join(FORMATS[c][0] for c in CODES.values())
        raise InputError(f"tensor {quoted(name)} for '{target}': dtype {array.dtype} cannot be stored (use {known})")
    return code, array.astype(stored_dtype(code), order="C", copy=False)  # keeps a 0-d array 0-d


def save_sharded(
    tensors: Mapping[str, np.ndarray],
    folder: str | Path,
    shards: int = 2,
    metadata: Mapping[str, str] | None = None,
    bfloat16: tuple[str, ...] = (),
) -> Path:
    """Write `tensors` as `shards` files `model-0000i-of-0000n.safetensors` (names dealt round-robin)
    plus `model.safetensors.index.json`, as Hugging Face lays them out; returns the index's path."""
    folder = Path(folder)
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        part = names[i::shards]
        file_name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += save_file({n: tensors[n] for n in part}, folder / file_name, metadata, bfloat16)
        weight_map.update({n: file_name for n in part})
    index = {"metadata": {"total_size": total, **(metadata or {})}, "weight_map": weight_map}
    atomic_write(folder / INDEX_FILE, json.dumps(index, indent=2))
    return folder / INDEX_FILE
