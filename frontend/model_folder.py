"""The one rule for the files a model folder holds, for every reader of one (config.json, the weights, an
index's shards, and whatever else a folder's reader opens: tokenizer and generation files).

A file is read only where it resolves, links followed, inside the folder, or inside the blobs of the same
Hugging Face cache repository. `huggingface-cli download` leaves a model as links into its repository's
blob store: `models--ORG--NAME/snapshots/<rev>/config.json -> ../../blobs/<sha>`, so a snapshot folder is a
model folder, and its links may lead to `models--ORG--NAME/blobs/` (that repository's, not another's).
Anything else (`../x`, an absolute path, a link to /etc/passwd) is refused in one line naming the file and
where it leads; the file's contents are never read, so never echoed.

A reader opens a folder's file through `model_file`. Opening a folder (`check_folder`: the config, the
weights) also holds every file in it and below to the rule, so a tokenizer file linking out of the folder
is refused before any reader of it (a tokenizer library that follows links) can open it. Folders whose
names start with a dot (`.git`, `.cache`: a clone's or the hub client's own records) are not model files.
"""

from __future__ import annotations

import os
from pathlib import Path

from turnip_ir.errors import InputError
from turnip_ir.limits import quoted

CACHE_PREFIX = "models--"
"""How the Hugging Face cache names a model repository's folder (`models--ORG--NAME`)."""


def model_file(folder: str | Path, name: str, what: str = "file") -> Path:
    """`folder / name` when it resolves inside `folder` or inside its cache repository's blobs (module
    docstring); else a one-line `InputError` that starts with `what` (what is being read: "config file",
    "safetensors index 'x': shard"), then the name. The file need not exist."""
    path = Path(folder) / name
    try:
        home = Path(folder).resolve()
        target = path.resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL in the name, a link loop
        raise InputError(f"{what} {quoted(name)} in '{folder}' cannot be resolved (a link loop, or a name the "
                         "system refuses)") from None
    if target.is_relative_to(home):
        return path
    blobs = cache_blobs(home)
    if blobs is not None and target.is_relative_to(blobs):
        return path
    also = " or in its Hugging Face cache repository's blobs" if blobs is not None else ""
    raise InputError(f"{what} {quoted(name)} leads to {str(target)!r}, outside the model folder '{folder}'; a model "
                     f"folder's files must lie in it{also}")


def check_folder(folder: str | Path, what: str = "model folder file") -> None:
    """Every file in `folder` and below (dot folders aside) follows the rule (`model_file`), or a one-line
    `InputError` for the first that does not."""
    for root, folders, names in os.walk(folder):  # links to folders are listed, not followed: checked as entries
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in [*folders, *sorted(names)]:
            model_file(folder, os.path.relpath(os.path.join(root, name), folder), what)


def cache_blobs(folder: Path) -> Path | None:
    """The blob store of the Hugging Face cache repository whose snapshot `folder` (resolved) is, or None."""
    snapshots = folder.parent
    repository = snapshots.parent
    if snapshots.name == "snapshots" and repository.name.startswith(CACHE_PREFIX):
        return repository / "blobs"
    return None
