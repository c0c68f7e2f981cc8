"""Training data: token ids from a file or from the caller, cut into the batches of a fine-tuning run.

Sources: `.npy` int ids [rows, T] (mapped, not read whole); `.npz` of 1-D int sequences of any lengths, in
the order the file lists them; `.jsonl` with a "text" string a line, tokenized by the model folder's
tokenizer (frontend/text.py: AutoTokenizer's ids, the special tokens its post-processor adds included).
From Python also a 2-D int array, or a list of 1-D int sequences or of strings.

Each example (a row or a sequence) is one sequence of a batch: its first `seq_len` tokens, padded at its
end to `seq_len` (default: the longest example). The labels are the ids, -100 at padding, so the loss
(transformers' causal-LM loss, labels shifted inside) ignores the padding; attention is causal, so padding
at the end changes no other position. Padding, not packing: a row packing several sequences would let
attention cross from one into the next, which separate rows in transformers never do. Micro-batch j
of a run reads examples jB .. jB+B-1, wrapping around at the end (an .npy's step k takes rows kB .. kB+B-1).

Checked before any step, one line naming the example: integer ids, every id in [0, vocab), every example
at least 2 tokens (one token predicts nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frontend.loss import IGNORE  # transformers' ignore_index: a label the loss leaves out
from frontend.text import Tokenizer, jsonl_texts
from runtime.array_files import NUMPY_READ_ERRORS
from turnip_ir.errors import InputError

SUFFIXES = (".npy", ".npz", ".jsonl")
CHECK_ROWS = 1 << 16
"""Rows of an .npy checked at a time (a mapped file is never held whole)."""


@dataclass
class Batch:
    """B sequences of T tokens and their labels (int64 [B, T]); `tokens`: the ids that are not padding."""

    ids: np.ndarray
    labels: np.ndarray
    tokens: int

    @property
    def predicted(self) -> int:
        """Positions the loss counts: a label after the first position of a sequence, not -100."""
        return int(np.count_nonzero(self.labels[:, 1:] != IGNORE))


class TrainingData:
    """Examples (a 2-D array's rows, or 1-D sequences), checked, served as batches (module docstring)."""

    def __init__(self, examples: np.ndarray | Sequence[np.ndarray], vocab_size: int, seq_len: int | None = None, where: str = "data"):
        self.examples, self.where = examples, where
        if len(examples) == 0:
            raise InputError(f"{where} holds no examples")
        if isinstance(examples, np.ndarray):
            _check_rows(examples, vocab_size, where)
            longest = examples.shape[1]
        else:
            for i, sequence in enumerate(examples):
                _check_sequence(np.asarray(sequence), vocab_size, f"{where}: sequence {i}")
            longest = max(len(s) for s in examples)
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 2):
            raise InputError(f"the sequence length must be an integer of 2 or more, got {seq_len!r}")
        self.seq_len = longest if seq_len is None else int(seq_len)
        self.truncated = sum(1 for s in self._lengths() if s > self.seq_len)
        """Examples longer than `seq_len`, of which a batch takes the first `seq_len` tokens."""

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, start: int, size: int) -> Batch:
        """Examples start .. start+size-1 (wrapping), cut or padded to `seq_len`."""
        ids = np.zeros((size, self.seq_len), np.int64)
        labels = np.full((size, self.seq_len), IGNORE, np.int64)
        tokens = 0
        for row in range(size):
            example = np.asarray(self.examples[(start + row) % len(self.examples)][: self.seq_len])
            ids[row, : len(example)] = example
            labels[row, : len(example)] = example
            tokens += len(example)
        return Batch(ids, labels, tokens)

    def _lengths(self):
        if isinstance(self.examples, np.ndarray):
            return [self.examples.shape[1]] * len(self.examples)
        return [len(s) for s in self.examples]


def read_examples(source, tokenizer: Callable[[], Tokenizer]) -> tuple[np.ndarray | list[np.ndarray], str]:
    """The examples of `source` (a path, an array [rows, T], or a list of sequences or strings) and how
    errors name it; `tokenizer()` gives the model folder's tokenizer, for text."""
    if isinstance(source, (str, Path)):
        return _read_file(Path(source), tokenizer), f"data '{source}'"
    if isinstance(source, np.ndarray):
        if source.ndim != 2:
            raise InputError(f"data as an array must be token ids [rows, T], got shape {list(source.shape)}")
        return source, "data"
    if isinstance(source, (list, tuple)) and all(isinstance(s, str) for s in source):
        return _encoded(list(source), tokenizer, "data"), "data"
    if isinstance(source, (list, tuple)):
        return [np.asarray(s) for s in source], "data"
    raise InputError(f"data must be a .npy, .npz or .jsonl path, an array of token ids or a list of sequences, got {type(source).__name__}")


def _read_file(path: Path, tokenizer) -> np.ndarray | list[np.ndarray]:
    if path.suffix not in SUFFIXES:
        raise InputError(f"data file '{path}' must be .npy (ids [rows, T]), .npz (1-D sequences) or .jsonl (\"text\" lines)")
    if not path.is_file():
        raise InputError(f"data file '{path}' does not exist")
    if path.suffix == ".jsonl":
        return _encoded(jsonl_texts(path, "text", "text"), tokenizer, f"data '{path}'")
    try:
        if path.suffix == ".npy":
            rows = np.load(path, mmap_mode="r", allow_pickle=False)
            if rows.ndim != 2:
                raise InputError(f"data '{path}' must hold token ids [rows, T], got shape {list(rows.shape)}")
            return rows
        with np.load(path, allow_pickle=False) as loaded:
            sequences = [loaded[name] for name in loaded.files]
    except NUMPY_READ_ERRORS as err:  # a damaged header makes numpy raise SyntaxError or TokenError too
        raise InputError(f"data file '{path}' is not a readable {path.suffix}: {' '.join(str(err).split())[:120]}") from None
    for name, sequence in zip(loaded.files, sequences):
        if sequence.ndim != 1:
            raise InputError(f"data '{path}': array '{name}' must be a 1-D sequence of token ids, got shape {list(sequence.shape)}")
    return sequences


def _encoded(texts: list[str], tokenizer, where: str) -> list[np.ndarray]:
    try:
        folder_tokenizer = tokenizer()
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    return [np.asarray(folder_tokenizer.encode(text), np.int64) for text in texts]


def _check_rows(rows: np.ndarray, vocab_size: int, where: str) -> None:
    if rows.dtype.kind not in "iu":
        raise InputError(f"{where} must hold integer token ids, got {rows.dtype}")
    if rows.shape[1] < 2:
        raise InputError(f"{where}: rows of {rows.shape[1]} token predict nothing; a row needs at least 2 tokens")
    for start in range(0, len(rows), CHECK_ROWS):
        block = rows[start : start + CHECK_ROWS]
        bad = np.argwhere((block < 0) | (block >= vocab_size))
        if len(bad):
            row, column = (int(i) for i in bad[0])
            raise InputError(f"{where}: row {start + row}: token id {int(block[row, column])} is outside the vocabulary [0, {vocab_size})")


def _check_sequence(ids: np.ndarray, vocab_size: int, where: str) -> None:
    if ids.dtype.kind not in "iu" or ids.ndim != 1:
        raise InputError(f"{where} must be a 1-D sequence of integer token ids, got {ids.dtype} of shape {list(ids.shape)}")
    if len(ids) < 2:
        raise InputError(f"{where} has {len(ids)} token; a sequence needs at least 2 (one predicts nothing)")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise InputError(f"{where}: token id {int(bad[0])} is outside the vocabulary [0, {vocab_size})")
