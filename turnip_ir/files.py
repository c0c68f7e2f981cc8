"""Every file turnip writes goes through here, so that none is ever left half-written.

A file is first written whole to a temporary beside it (a unique name from `tempfile.mkstemp`, so
concurrent writers of one path never share one), flushed to disk, then renamed over the target with
`os.replace`, which is atomic within a folder: a reader sees the old file or the new one, never a mix.
On any failure the temporary is removed, the old file stays, and the error names the target:
"cannot write PATH: reason".

A command that writes several files prepares all their temporaries first and renames them only once
every one is written (`write_all`), so a failure on the last leaves all the old files in place.
`check_outputs` refuses, before a command does any work, an output that is one of its inputs or another
of its outputs. An input may be a folder (a model folder, a folder of plans): it stands for every file in
it and below, whatever they are named, so no output replaces a config, a shard, a tokenizer file or a plan.
Paths are compared resolved (links followed) and by file identity (device and inode: hard links, links
from elsewhere into the folder, or a Hugging Face cache blob a folder's link points at).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from turnip_ir.errors import InputError

Contents = Union[str, bytes, Callable[[BinaryIO], None]]
"""Text (written as UTF-8), bytes, or a function that writes into a binary file handle."""


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; done once, at import
    os.umask(mask)
    return mask


NEW_FILE_MODE = 0o666 & ~_umask()
"""What `open(path, "w")` would give a new file; mkstemp makes its temporaries private (0600)."""


@dataclass
class Pending:
    """A temporary holding a target's whole new contents, waiting to be renamed over it."""

    target: Path
    temporary: Path

    def commit(self) -> None:
        try:
            os.replace(self.temporary, self.target)
        except OSError as err:
            self.discard()
            raise _cannot_write(self.target, err) from None

    def discard(self) -> None:
        try:
            os.unlink(self.temporary)
        except OSError:
            pass  # already gone, or its folder is: nothing is left to clean


def atomic_write(path: str | Path, data: Contents) -> Path:
    """Write `data` to `path` whole or not at all; returns the path written."""
    return write_all([(path, data)])[0]


def write_all(items: Iterable[tuple[str | Path, Contents]]) -> list[Path]:
    """Write every (path, data), or none: all temporaries are written before any is renamed into place."""
    items = list(items)
    pending: list[Pending] = []
    try:
        for path, data in items:
            pending.append(prepare(path, data))
        while pending:
            pending[0].commit()
            pending.pop(0)
    finally:
        for left in pending:
            left.discard()
    return [Path(path) for path, _ in items]


def prepare(path: str | Path, data: Contents) -> Pending:
    """The temporary for `path`, holding `data`, flushed to disk; raises InputError naming `path`."""
    target = Path(path)
    try:
        temporary = _write_temporary(target, data)
    except OSError as err:
        raise _cannot_write(target, err) from None
    return Pending(target, temporary)


def _write_temporary(target: Path, data: Contents) -> Path:
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            if callable(data):
                data(out)
            else:
                out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fchmod(out.fileno(), _mode(target))
            os.fsync(out.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def _mode(target: Path) -> int:
    """A replaced file keeps its permissions; a new one gets what the umask allows."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return NEW_FILE_MODE


def _cannot_write(target: Path, err: OSError) -> InputError:
    return InputError(f"cannot write {target}: {err.strerror or err}")


def check_outputs(outputs: Mapping[str, str | Path | None], inputs: Mapping[str, str | Path | None]) -> None:
    """Refuse, before any work, an output whose folder is missing, that is a folder, that is one of the
    inputs (or a file of an input folder), or that is another output. Keys are how the user named each
    path (a flag, or FILE)."""
    given_inputs = [(flag, path) for flag, path in inputs.items() if path is not None]
    seen: list[tuple[str, str | Path]] = []
    for flag, path in outputs.items():
        if path is None:
            continue
        if not is_folder(Path(path).resolve().parent):
            raise InputError(f"cannot write {path}: its folder does not exist")
        if is_folder(path):
            raise InputError(f"cannot write {path}: it is a folder")
        for other_flag, other in given_inputs:
            clash = _input_file_at(path, other)
            if clash is not None:
                what = f"the input file {other}"
                if is_folder(other):  # the clash itself, or the file it is another name of
                    what = f"a file of {other_flag} {other}" if clash == Path(path) else f"{clash}, a file of {other_flag} {other}"
                raise InputError(f"{flag} {path} is {what}: writing it would destroy the input, choose another path")
        for other_flag, other in seen:
            if _same(path, other):
                raise InputError(f"{flag} {path} is also {other_flag} {other}: choose two different paths")
        seen.append((flag, path))


def is_folder(path: str | Path) -> bool:
    """Whether `path` is a folder (links followed); False for a name the system refuses (too long, a NUL)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def is_file(path: str | Path) -> bool:
    """Whether `path` is a regular file (links followed); False for a name the system refuses."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _input_file_at(path: str | Path, source: str | Path) -> Path | None:
    """The file of input `source` (a file, or any file in a folder) that writing `path` would replace."""
    if not is_folder(source):
        return Path(source) if _same(path, source) else None
    folder = Path(source).resolve()
    if os.path.lexists(path) and Path(path).parent.resolve().is_relative_to(folder):
        return Path(path)  # an entry of the folder or of one below it, a link of any kind included
    try:
        wanted = os.stat(path)
    except (OSError, ValueError):
        return None  # nothing there yet: writing it replaces no file
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                found = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (wanted.st_dev, wanted.st_ino):
                return Path(root, name)
    return None


def _same(a: str | Path, b: str | Path) -> bool:
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        return os.path.samefile(a, b)  # hard links, or paths through different mounts
    except (OSError, ValueError):
        return False  # one of them does not exist yet, or cannot be named
