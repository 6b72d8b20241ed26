"""One broker per data directory: a second one would interleave writes to the same log."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tidemq.core.errors import ConfigError

__all__ = ["DataDirLock"]


class DataDirLock:
    """An advisory lock on `<data_dir>/lock` that the kernel drops when the process dies,
    even by kill -9. Owned by the broker's start and stop."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or a ConfigError when another process holds it."""
        data_dir = self._data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(
                f"data directory {data_dir} is in use by another tidemq process"
            ) from None
        self._fd = fd

    def release(self) -> None:
        fd = self._fd
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock
            self._fd = None
