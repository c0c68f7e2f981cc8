"""The safetensors reader and writer: round trips per dtype, sharded indexes, exact BF16, lazy views,
and a one-line error for every way a file can be missing or broken. Cross-checked against the
`safetensors` package when it is installed."""

from __future__ import annotations

import json
import mmap
import struct

import ml_dtypes
import numpy as np
import pytest

from turnip_ir.errors import InputError
from turnip_ir.limits import quoted
from frontend.safetensors import INDEX_FILE, SafeTensors, save_file, save_sharded


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 4)).astype(np.float16),
        "model.norm.weight": rng.standard_normal(4).astype(np.float32),
        "lm_head.weight": rng.standard_normal((3, 2, 2)),
        "ids32": np.arange(-3, 3, dtype=np.int32),
        "ids64": np.array([[1 << 40, -5]], dtype=np.int64),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 7), dtype=np.float16),
    }


def test_round_trip_per_dtype_with_metadata(tmp_path) -> None:
    tensors = _tensors()
    save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt"})
    st = SafeTensors.open(tmp_path / "m.safetensors")
    assert sorted(st.names()) == sorted(tensors) and len(st) == len(tensors)
    assert st.metadata == {"format": "pt"}
    for name, want in tensors.items():
        got = st.get(name)
        assert (st.shape(name), st.dtype(name)) == (want.shape, want.dtype.name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert "model.norm.weight" in st and "nope" not in st


def _root(array):
    """What an array's memory finally belongs to: the file's `mmap` for a tensor read in place."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_tensors_are_read_only_views_of_one_map(tmp_path) -> None:
    big = (np.arange(1 << 16) % 1000).astype(np.float32).reshape(256, 256)
    save_file({"a": big, "b": big[:2]}, tmp_path / "m.safetensors")
    st = SafeTensors.open(tmp_path / "m.safetensors")
    a, b = st.get("a"), st["b"]
    assert not a.flags.writeable and not a.flags.owndata
    assert _root(a) is _root(b) and type(_root(a)).__name__ == "mmap"  # one map of the file, no copy
    assert _root(st.get("a", dtype=np.float32)) is _root(a)  # asking for the stored dtype copies nothing
    converted = st.get("a", dtype="float16")
    assert converted.dtype == np.float16 and converted.flags.owndata


def test_data_is_little_endian_and_8_byte_aligned(tmp_path) -> None:
    save_file({"x": np.array([1.0, -2.0], dtype=">f4")}, tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert length % 8 == 0
    assert header["x"] == {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert raw[8 + length :] == struct.pack("<2f", 1.0, -2.0)


@pytest.mark.parametrize("open_by", ["folder", "index"])
def test_sharded_index(tmp_path, open_by) -> None:
    tensors = _tensors()
    index = save_sharded(tensors, tmp_path, shards=3, metadata={"format": "pt"})
    assert index == tmp_path / INDEX_FILE
    weight_map = json.loads(index.read_text())["weight_map"]
    assert len(set(weight_map.values())) == 3
    st = SafeTensors.open(tmp_path if open_by == "folder" else index)
    assert sorted(st.names()) == sorted(tensors)
    assert st.metadata["total_size"] == str(sum(t.nbytes for t in tensors.values()))
    for name, want in tensors.items():
        assert st.file(name).name == weight_map[name]
        np.testing.assert_array_equal(st.get(name), want)


def test_folder_prefers_the_index_and_takes_a_single_file(tmp_path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    assert SafeTensors.open(tmp_path).names() == ["w"]


# ----- bfloat16 -----------------------------------------------------------------------------------------------


def bfloat16_words(values: np.ndarray) -> np.ndarray:
    """The oracle: float32 -> bfloat16 bit patterns, round to nearest even on the bits, NaN kept quiet."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def test_every_bfloat16_word_decodes_to_its_float32_exactly(tmp_path) -> None:
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    save_file({"w": np.zeros(1 << 16, np.float32)}, tmp_path / "w.safetensors", bfloat16=("w",))
    with open(tmp_path / "w.safetensors", "r+b") as handle:  # every bit pattern, written over the zeros
        handle.seek(-(2 << 16), 2)
        handle.write(words.tobytes())
    values = SafeTensors.open(tmp_path / "w.safetensors").get("w")
    assert values.dtype == np.float32
    assert np.array_equal(values.view(np.uint32), words.astype(np.uint32) << 16)  # NaN payloads too


def test_bfloat16_is_read_as_a_view_in_its_own_type(tmp_path) -> None:
    values = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    save_file({"w": values}, tmp_path / "w.safetensors", bfloat16=("w",))
    st = SafeTensors.open(tmp_path / "w.safetensors")
    view = st.get("w", dtype="bfloat16")
    assert view.dtype == ml_dtypes.bfloat16 and isinstance(_root(view), mmap.mmap) and not view.flags.writeable
    assert np.array_equal(view.view(np.uint16), bfloat16_words(values))


@pytest.mark.parametrize("seed", range(3))
def test_ml_dtypes_rounds_float32_like_the_bit_oracle(seed) -> None:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    nan = np.isnan(values)
    with np.errstate(invalid="ignore"):
        got = values.astype(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16)[~nan], bfloat16_words(values)[~nan])
    assert np.isnan(got[nan]).all() and np.array_equal(np.signbit(got[nan]), np.signbit(values[nan]))  # payloads differ


def test_bfloat16_round_trips_exactly_and_rounds_to_nearest_even(tmp_path) -> None:
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    exact = (words.astype(np.uint32) << 16).view(np.float32)
    exact = exact[~np.isnan(exact)]
    one, ulp = 1.0, 2.0**-7
    ties = np.array([one + ulp / 2, one + 3 * ulp / 2, -(one + ulp / 2), np.finfo(np.float32).max], dtype=np.float32)
    tensors = {"exact": exact, "ties": ties, "nan": np.array([np.nan], np.float32), "scalar": np.array(1.5)}
    save_file(tensors, tmp_path / "b.safetensors", bfloat16=tuple(tensors))
    st = SafeTensors.open(tmp_path / "b.safetensors")
    assert st.dtype("exact") == "bfloat16" and st.raw("exact").dtype == ml_dtypes.bfloat16
    got = st.get("exact")
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), exact.view(np.uint32))
    assert st.get("ties").tolist() == [one, one + 2 * ulp, -one, np.inf]
    assert np.isnan(st.get("nan")).all()
    assert st.shape("scalar") == () and st.get("scalar") == np.float32(1.5)
    np.testing.assert_array_equal(st.get("exact", dtype="float64"), exact.astype(np.float64))
    assert st.get("ties", dtype=np.float16).dtype == np.float16


def test_float32_to_bfloat16_matches_truncation_when_exact() -> None:
    values = np.array([0.0, -0.0, 1.0, -2.5, 65280.0, np.inf, -np.inf], dtype=np.float32)
    assert np.array_equal(values.astype(ml_dtypes.bfloat16).view(np.uint16), (values.view(np.uint32) >> 16).astype(np.uint16))


def test_a_narrowing_to_float16_that_overflows_names_the_tensor(tmp_path) -> None:
    save_file({"big": np.array([1.0, -70000.0], np.float32), "fine": np.array([65280.0], np.float32)},
              tmp_path / "b.safetensors", bfloat16=("big", "fine"))
    st = SafeTensors.open(tmp_path / "b.safetensors")
    with pytest.raises(InputError, match=r"^tensor 'big' in '.*b.safetensors': values up to 7\.014e\+04 overflow float16 "
                       r"\(largest 65504\); run it in bfloat16 or float32 \(--dtype\)$"):
        st.get("big", dtype="float16")
    assert st.get("fine", dtype="float16").tolist() == [65280.0]  # the largest bfloat16 below float16's limit
    assert st.get("big", dtype="bfloat16").astype(np.float32).tolist() == [1.0, -70144.0]


# ----- errors ---------------------------------------------------------------------------------------------------


def _error(path, **get) -> str:
    with pytest.raises(InputError) as caught:
        st = SafeTensors.open(path)
        if get:
            st.get(**get)
    message = str(caught.value)
    assert "\n" not in message
    return message


def _with_header(path, header, data: bytes = b"", length: int | None = None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def test_missing_files(tmp_path) -> None:
    assert _error(tmp_path / "nope.safetensors") == f"safetensors file '{tmp_path}/nope.safetensors' does not exist"
    assert _error(tmp_path) == f"folder '{tmp_path}' has neither model.safetensors nor model.safetensors.index.json"


def test_missing_tensor_and_wrong_shape_name_tensor_and_file(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((2, 3), np.float32)}, path)
    assert _error(path, name="model.norm.weight") == f"tensor 'model.norm.weight' is not in '{path}'"
    assert _error(path, name="w", shape=(3, 2)) == f"tensor 'w' in '{path}': expected shape [3, 2], found [2, 3]"
    assert SafeTensors.open(path).get("w", shape=[2, 3]).shape == (2, 3)


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    "header,data,length,message",
    [
        ("not json", b"", None, "malformed header: 1:1: expecting value"),
        ([1, 2], b"", None, "malformed header: not a JSON object"),
        ({"w": {"dtype": "F32", "shape": [2]}}, b"", None, "tensor 'w' in '{p}': malformed header entry (needs exactly dtype, shape, data_offsets)"),
        ({"w": {**ENTRY, "dtype": "F8_E4M3"}}, b"x" * 8, None, "tensor 'w' in '{p}': dtype 'F8_E4M3' is not supported (supported: F16, BF16, F32, F64, I32, I64)"),
        ({"w": {**ENTRY, "shape": [2.0]}}, b"x" * 8, None, "tensor 'w' in '{p}': malformed header: shape [2.0] must be a list of sizes"),
        ({"w": {**ENTRY, "data_offsets": [0]}}, b"x" * 8, None, "tensor 'w' in '{p}': malformed header: data_offsets [0] must be [begin, end]"),
        ({"w": {**ENTRY, "data_offsets": [0, 4]}}, b"x" * 8, None, "tensor 'w' in '{p}': data_offsets [0, 4] hold 4 bytes, its F32 shape [2] needs 8"),
        ({"w": {**ENTRY, "data_offsets": [4, 12]}}, b"x" * 8, None, "tensor 'w' in '{p}': data_offsets [4, 12] run past the end of the file (data section of 8 bytes)"),
        ({"w": ENTRY}, b"x" * 4, None, "tensor 'w' in '{p}': data_offsets [0, 8] run past the end of the file (data section of 4 bytes)"),
        ({"w": ENTRY, "v": ENTRY}, b"x" * 8, None, "data_offsets [0, 8] overlap tensor '"),
        ({"w": ENTRY, "v": {**ENTRY, "data_offsets": [4, 12]}}, b"x" * 12, None,
         "tensor 'v' in '{p}': data_offsets [4, 12] overlap tensor 'w'"),
        ({"w": {**ENTRY, "data_offsets": [8, 16]}}, b"x" * 16, None,
         "tensor 'w' in '{p}': data_offsets [8, 16] leave a gap of 8 bytes before them"),
        ({"w": ENTRY, "v": {**ENTRY, "data_offsets": [12, 20]}}, b"x" * 20, None,
         "tensor 'v' in '{p}': data_offsets [12, 20] leave a gap of 4 bytes before them"),
        ({"w": ENTRY}, b"x" * 9, None, "safetensors file '{p}': 1 trailing bytes after the last tensor's data"),
        ({}, b"x", None, "safetensors file '{p}': 1 trailing bytes after the last tensor's data"),
        ({"__metadata__": {"n": 1}}, b"", None, "malformed header: __metadata__ must map strings to strings"),
        ({"w": ENTRY}, b"x" * 8, 1 << 40, "'{p}' is not a safetensors file (its header length runs past the end of the file)"),
    ],
    ids=["json", "array", "entry", "dtype", "shape", "offsets", "size", "past-end", "truncated", "same-range", "overlap",
         "gap-first", "gap-between", "trailing", "trailing-empty", "metadata", "length"],
)
def test_malformed_files(tmp_path, header, data, length, message) -> None:
    path = tmp_path / "m.safetensors"
    if header == "not json":
        path.write_bytes(struct.pack("<Q", 8) + b"not json")
    else:
        _with_header(path, header, data, length)
    assert message.format(p=path) in _error(path)


def test_zero_sized_tensors_and_out_of_order_offsets_tile(tmp_path) -> None:
    path = _with_header(tmp_path / "m.safetensors", {"b": {**ENTRY, "data_offsets": [8, 16]}, "a": ENTRY,
                                                      "e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [8, 8]}},
                        struct.pack("<4f", 1, 2, 3, 4))
    st = SafeTensors.open(path)
    assert st.get("a").tolist() == [1, 2] and st.get("b").tolist() == [3, 4] and st.get("e").shape == (0, 3)


def test_file_shorter_than_its_header_length(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x01\x02")
    assert _error(path) == f"safetensors file '{path}' is shorter than its 8-byte header length"


def test_broken_indexes(tmp_path) -> None:
    index = tmp_path / INDEX_FILE
    index.write_text("{")
    assert _error(index).startswith(f"safetensors index '{index}' is not valid JSON")
    index.write_text(json.dumps({"metadata": {}}))
    assert _error(index) == f"safetensors index '{index}' needs a 'weight_map' of tensor name -> file name"
    index.write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    assert _error(index) == f"safetensors index '{index}': shard 'gone.safetensors' does not exist"
    save_file({"v": np.ones(1, np.float32)}, tmp_path / "a.safetensors")
    index.write_text(json.dumps({"weight_map": {"w": "a.safetensors"}}))
    assert _error(index) == f"tensor 'w' is not in '{tmp_path}/a.safetensors' (the index '{index}' maps it there)"


@pytest.mark.parametrize("shard", ["../outside.safetensors", "../../outside.safetensors", "{abs}", "link.safetensors",
                                   "sub/../../outside.safetensors"])
def test_an_index_cannot_name_a_shard_outside_its_folder(tmp_path, shard) -> None:
    folder = tmp_path / "a" / "model"
    folder.mkdir(parents=True)
    for outside in (tmp_path / "outside.safetensors", tmp_path / "a" / "outside.safetensors"):
        save_file({"w": np.ones(2, np.float32)}, outside)
    (folder / "sub").mkdir()
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    shard = shard.format(abs=tmp_path / "outside.safetensors")
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": {"w": shard}}))
    message = _error(folder)  # opening the folder refuses its link out first, whatever the index names
    assert message.startswith(f"model folder file 'link.safetensors' leads to '{tmp_path / 'outside.safetensors'}'")
    assert message.endswith(f", outside the model folder '{folder}'; a model folder's files must lie in it")
    message = _error(folder / INDEX_FILE)  # the index opened as a file: its shards by the same rule
    assert message.startswith(f"safetensors index '{folder / INDEX_FILE}': shard {quoted(shard)} leads to ")
    assert message.endswith(f", outside the model folder '{folder}'; a model folder's files must lie in it")


def test_a_link_inside_the_folder_is_a_shard(tmp_path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "real.safetensors")
    (tmp_path / "link.safetensors").symlink_to(tmp_path / "real.safetensors")
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"w": "link.safetensors"}}))
    assert SafeTensors.open(tmp_path).get("w").tolist() == [1.0, 1.0]


def test_a_foreign_file_is_named_but_its_bytes_are_never_echoed(tmp_path) -> None:
    secret = b"hunter2:x:0:0:hunter2:/home:/bin/sh\n" * 4
    (tmp_path / "passwd.safetensors").write_bytes(secret)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"w": "passwd.safetensors"}}))
    message = _error(tmp_path)
    assert message == f"'{tmp_path}/passwd.safetensors' is not a safetensors file (its header length runs past the end of the file)"
    assert str(struct.unpack("<Q", secret[:8])[0]) not in message and "hunter2" not in message
    (tmp_path / "bin.safetensors").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe\xfdA")
    assert _error(tmp_path / "bin.safetensors") == f"'{tmp_path}/bin.safetensors' is not a safetensors file (its header is not UTF-8 JSON)"


def test_writer_errors(tmp_path) -> None:
    with pytest.raises(InputError, match=r"^tensor 'b' for '.*': dtype bool cannot be stored \(use float16, float32"):
        save_file({"b": np.ones(2, bool)}, tmp_path / "m.safetensors")
    with pytest.raises(InputError, match=r"^tensor 'i' for '.*': only a float array can be stored as BF16, not int64$"):
        save_file({"i": np.ones(2, np.int64)}, tmp_path / "m.safetensors", bfloat16=("i",))
    assert not list(tmp_path.iterdir())  # nothing half-written


# ----- the reference implementation ----------------------------------------------------------------------------


def test_agrees_with_the_safetensors_package(tmp_path) -> None:
    reference = pytest.importorskip("safetensors.numpy")
    tensors = _tensors()
    save_file(tensors, tmp_path / "ours.safetensors", metadata={"who": "turnip"})
    theirs = reference.load_file(str(tmp_path / "ours.safetensors"))
    assert sorted(theirs) == sorted(tensors)
    for name, want in tensors.items():
        assert theirs[name].dtype == want.dtype
        np.testing.assert_array_equal(theirs[name], want)
    reference.save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata={"who": "them"})
    st = SafeTensors.open(tmp_path / "theirs.safetensors")
    assert st.metadata == {"who": "them"}
    for name, want in tensors.items():
        np.testing.assert_array_equal(st.get(name), want)


HOSTILE_JSON = {  # text inside a JSON object's value -> what the one line says
    "deep": ("[" * 100_000 + "]" * 100_000, "arrays and objects nest too deep (at most 200 levels)"),
    "deep-300": ("[" * 300 + "]" * 300, "arrays and objects nest too deep (at most 200 levels)"),
    "digits": ("1" + "0" * 5000, "an integer has thousands of digits"),
    "nan": ("NaN", "NaN is not a finite number"),
    "infinity": ("-Infinity", "-Infinity is not a finite number"),
    "overflow": ("1e999", "1e999 is not a finite number"),
}
"""JSON Python's reader takes or crashes on (RecursionError, ValueError), each refused in one line."""


@pytest.mark.parametrize("value", list(HOSTILE_JSON))
def test_a_hostile_header_or_index_is_one_line(tmp_path, value) -> None:
    text, message = HOSTILE_JSON[value]
    header = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "x": ' + text + "}").encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    assert _error(path).startswith(f"safetensors file '{path}': malformed header: {message}")
    index = tmp_path / INDEX_FILE
    index.write_text('{"weight_map": {"w": "m.safetensors"}, "metadata": ' + text + "}")
    assert _error(index).startswith(f"safetensors index '{index}' is not valid JSON: {message}")
