"""The store's only door to the disk.

Everything the store does to files goes through a `FileSystem`, so that tests can swap in
`tidemq.testing.files.FaultFileSystem`, which loses what was not fsynced, tears writes and
injects EIO/ENOSPC. `OsFileSystem` is the real one.

Contract (what the store relies on, and what a fake must model):

* `FileHandle.append` writes all bytes at the end of the file or raises; after an OSError
  the file may hold a prefix of them (the caller truncates back).
* Nothing is durable until `FileHandle.sync` or `FileSystem.sync_files` (file data) and,
  for a created, renamed or removed name, `FileSystem.sync_dir` of its directory.
* `replace` is atomic: after a crash the name holds the old or the new file.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Protocol

__all__ = ["FileHandle", "FileSystem", "OsFileSystem", "ensure_dir", "sync_each"]

Buffer = bytes | bytearray | memoryview


class FileHandle(Protocol):
    """An open file, read-write, appended at its end. One owner at a time."""

    def append(self, buffers: Sequence[Buffer]) -> None:
        """Write the buffers, in order, at the end of the file."""
        ...

    def pread(self, position: int, size: int) -> bytes:
        """Up to `size` bytes from `position` (fewer at the end of the file)."""
        ...

    def sync(self) -> None:
        """fdatasync: the data written so far survives power loss. Raises OSError on failure."""
        ...

    def truncate(self, size: int) -> None: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class FileSystem(Protocol):
    def open(self, path: Path, *, create: bool = False) -> FileHandle: ...

    def exists(self, path: Path) -> bool: ...

    def listdir(self, path: Path) -> list[str]:
        """Names in a directory, [] if it does not exist."""
        ...

    def makedirs(self, path: Path) -> None: ...

    def remove(self, path: Path) -> None: ...

    def remove_tree(self, path: Path) -> None: ...

    def replace(self, source: Path, target: Path) -> None: ...

    def sync_dir(self, path: Path) -> None: ...

    def sync_dirs(self, paths: Sequence[Path]) -> None:
        """Make these directories' entries durable, as `sync_dir` of each would (in
        order); it may sync more. Raises OSError on failure."""
        ...

    def sync_files(self, paths: Sequence[Path]) -> None:
        """Make the data written to these files (open or closed) durable, as `sync` of
        each would; it may sync more. Raises OSError on failure."""
        ...

    def read_bytes(self, path: Path) -> bytes: ...

    def disk_usage(self, path: Path) -> tuple[int, int]:
        """(total bytes, free bytes) of the filesystem holding `path`."""
        ...


def sync_each(fs: FileSystem, paths: Sequence[Path]) -> None:
    """`sync_files` the plain way: open, sync and close each file in turn."""
    for path in paths:
        handle = fs.open(path)
        try:
            handle.sync()
        finally:
            handle.close()


def ensure_dir(fs: FileSystem, path: Path) -> None:
    """Create `path` and its missing parents durably: each new directory's entry is
    synced in its parent, or a power loss could take the directory, and every synced file
    in it, away."""
    missing = []
    probe = path
    while not fs.exists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if not missing:
        return
    fs.makedirs(path)
    for created in reversed(missing):
        fs.sync_dir(created.parent)


class OsFile:
    """A FileHandle over a POSIX file descriptor."""

    __slots__ = ("_fd", "_size", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._size = os.lseek(fd, 0, os.SEEK_END)

    def append(self, buffers: Sequence[Buffer]) -> None:
        total = sum(len(b) for b in buffers)
        written = os.pwritev(self._fd, buffers, self._size)
        while written < total:  # short writes happen near ENOSPC; finish or raise
            rest = _skip(buffers, written)
            more = os.pwritev(self._fd, rest, self._size + written)
            if more == 0:
                raise OSError(28, "short write")
            written += more
        self._size += total

    def pread(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def size(self) -> int:
        return self._size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _skip(buffers: Sequence[Buffer], count: int) -> list[Buffer]:
    out: list[Buffer] = []
    for buf in buffers:
        if count >= len(buf):
            count -= len(buf)
            continue
        out.append(memoryview(buf)[count:])
        count = 0
    return out


#: From this many files on, `OsFileSystem.sync_files` makes one syncfs(2) call instead of
#: an fdatasync per file. A checkpoint of a broker whose traffic is spread over thousands of
#: queues writes thousands of index files; on ext4 each fdatasync of an appended file
#: commits the journal on its own (about 70 us more per file than one syncfs for them all,
#: measured with benchmarks/bench_checkpoint.py, and all on the event loop). Below this,
#: syncfs' walk over every dirty inode of the filesystem costs more than the fdatasyncs.
SYNCFS_MIN_FILES: Final = 8


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs on Linux (which reports writeback errors since 5.8), else None."""
    if sys.platform != "linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int,)
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()


def _sync_whole_filesystems(paths: Sequence[Path]) -> bool:
    """syncfs once per filesystem holding `paths` (files or directories), when there are
    enough of them for that to be cheaper than one sync each: True if done."""
    if _syncfs is None or len(paths) < SYNCFS_MIN_FILES:
        return False
    # One syncfs per filesystem the paths are on (a queue directory may be a mount).
    one_per_device = {os.stat(path).st_dev: path for path in paths}
    for path in one_per_device.values():
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if _syncfs(fd) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"syncfs: {os.strerror(code)}", str(path))
        finally:
            os.close(fd)
    return True


class OsFileSystem:
    """The real filesystem."""

    def open(self, path: Path, *, create: bool = False) -> OsFile:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0)
        return OsFile(path, os.open(path, flags, 0o644))

    def exists(self, path: Path) -> bool:
        return path.exists()

    def listdir(self, path: Path) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def makedirs(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def remove(self, path: Path) -> None:
        path.unlink()

    def remove_tree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=False)

    def replace(self, source: Path, target: Path) -> None:
        os.replace(source, target)

    def sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_dirs(self, paths: Sequence[Path]) -> None:
        # New queues at a checkpoint: one new directory each, whose fsync costs as much
        # as a file's (about 0.14 ms here), so many go through syncfs too.
        if not _sync_whole_filesystems(paths):
            for path in paths:
                self.sync_dir(path)

    def sync_files(self, paths: Sequence[Path]) -> None:
        if not _sync_whole_filesystems(paths):
            sync_each(self, paths)

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def disk_usage(self, path: Path) -> tuple[int, int]:
        st = os.statvfs(path)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
