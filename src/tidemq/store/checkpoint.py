"""Reading and writing the checkpoint file (layout in `format.checkpoint`)."""

from __future__ import annotations

from pathlib import Path

from tidemq.core.errors import CorruptRecordError
from tidemq.store.files import FileSystem
from tidemq.store.format.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint

__all__ = ["read_checkpoint", "write_checkpoint"]

NAME = "checkpoint"


def read_checkpoint(fs: FileSystem, directory: Path) -> Checkpoint | None:
    """The checkpoint, or None when it is missing or damaged (then recovery replays all)."""
    path = directory / NAME
    if not fs.exists(path):
        return None
    try:
        return decode_checkpoint(fs.read_bytes(path))
    except CorruptRecordError:
        return None


def write_checkpoint(fs: FileSystem, directory: Path, cp: Checkpoint) -> None:
    """Temp file, fsync, rename, fsync the directory: the name always holds a whole file."""
    tmp = directory / (NAME + ".tmp")
    handle = fs.open(tmp, create=True)
    try:
        handle.truncate(0)
        handle.append((encode_checkpoint(cp),))
        handle.sync()
    finally:
        handle.close()
    fs.replace(tmp, directory / NAME)
    # Without this the rename itself may be lost on power failure.
    fs.sync_dir(directory)
