"""Commit-log segment files: roll, locate, read, truncate, delete.

A segment is named by the log position of its first byte (20 decimal digits), so positions
are dense across segments: segment k+1 starts where segment k's last record ends. Only the
last segment is written. A segment is synced before the next one is created, so every
segment but the last is whole; only the last can have a torn tail after a crash.

Single writer: the store's owner serialises every call.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from tidemq.core.errors import CorruptRecordError
from tidemq.store.files import Buffer, FileHandle, FileSystem, ensure_dir

__all__ = ["SegmentedLog", "segment_name"]

_SUFFIX = ".log"
#: Sealed segments kept open for reads; each costs one file descriptor.
_OPEN_SEALED_MAX = 16


def segment_name(start: int) -> str:
    return f"{start:020d}{_SUFFIX}"


class SegmentedLog:
    """The segment files of one commit log, addressed by log position."""

    def __init__(self, fs: FileSystem, directory: Path, segment_size_bytes: int) -> None:
        self._fs = fs
        self._dir = directory
        self._segment_size = segment_size_bytes
        ensure_dir(fs, directory)
        starts = sorted(
            int(name[: -len(_SUFFIX)])
            for name in fs.listdir(directory)
            if name.endswith(_SUFFIX) and name[: -len(_SUFFIX)].isdigit()
        )
        if not starts:
            fs.open(self._path(0), create=True).close()
            fs.sync_dir(directory)
            starts = [0]
        self._starts: list[int] = starts
        self._active: FileHandle = fs.open(self._path(starts[-1]))
        self._sealed: OrderedDict[int, FileHandle] = OrderedDict()

    def _path(self, start: int) -> Path:
        return self._dir / segment_name(start)

    @property
    def directory(self) -> Path:
        return self._dir

    # ------------------------------------------------------------------ positions

    @property
    def start_position(self) -> int:
        return self._starts[0]

    @property
    def active_start(self) -> int:
        return self._starts[-1]

    @property
    def end_position(self) -> int:
        return self._starts[-1] + self._active.size()

    def segment_starts(self) -> list[int]:
        return list(self._starts)

    def segment_end(self, start: int) -> int:
        """End position of a segment (the next one's start, or the log end)."""
        i = self._starts.index(start)
        return self._starts[i + 1] if i + 1 < len(self._starts) else self.end_position

    # ------------------------------------------------------------------ writing

    def needs_roll(self, size: int) -> bool:
        used = self._active.size()
        return used > 0 and used + size > self._segment_size

    def roll(self) -> None:
        """Seal the active segment (sync it) and start a new one at the log end."""
        self._active.sync()
        new_start = self.end_position
        handle = self._fs.open(self._path(new_start), create=True)
        self._fs.sync_dir(self._dir)
        old = self._active
        self._sealed[self._starts[-1]] = old
        self._trim_sealed()
        self._starts.append(new_start)
        self._active = handle

    def append(self, buffers: Sequence[Buffer], size: int) -> int:
        """Append one record (rolling first if it does not fit); return its position.

        On OSError the active segment is truncated back, so a failed append leaves nothing.
        """
        if self.needs_roll(size):
            self.roll()
        position = self.end_position
        before = self._active.size()
        try:
            self._active.append(buffers)
        except OSError:
            self._active.truncate(before)
            raise
        return position

    def sync(self) -> None:
        self._active.sync()

    def active_handle(self) -> FileHandle:
        """The segment being written, for a flush that runs on another thread: the handle
        stays open until at least 16 more segments roll, far longer than one fdatasync."""
        return self._active

    def truncate(self, position: int) -> None:
        """Cut the active segment at `position` (recovery of a torn tail)."""
        start = self._starts[-1]
        assert start <= position <= self.end_position
        self._active.truncate(position - start)
        self._active.sync()

    def truncate_from(self, position: int) -> None:
        """Cut the log at `position`, anywhere in it (a replica dropping a suffix its
        leader has not got): later segments are deleted, the one holding `position`
        becomes the active one, cut there and synced."""
        if not self._starts[0] <= position <= self.end_position:
            raise CorruptRecordError(
                f"cannot cut the log at {position}: it spans [{self._starts[0]}, "
                f"{self.end_position})"
            )
        while len(self._starts) > 1 and self._starts[-1] > position:
            self._active.close()
            self._fs.remove(self._path(self._starts.pop()))
            # Newest first, each removal durable before the next: a crash leaves the log
            # a prefix of itself, never with a hole where a middle segment was.
            self._fs.sync_dir(self._dir)
            handle = self._sealed.pop(self._starts[-1], None)
            self._active = handle or self._fs.open(self._path(self._starts[-1]))
        self.truncate(position)

    # ------------------------------------------------------------------ reading

    def _handle(self, start: int) -> FileHandle:
        if start == self._starts[-1]:
            return self._active
        handle = self._sealed.get(start)
        if handle is None:
            handle = self._fs.open(self._path(start))
            self._sealed[start] = handle
            self._trim_sealed()
        else:
            self._sealed.move_to_end(start)
        return handle

    def _trim_sealed(self) -> None:
        while len(self._sealed) > _OPEN_SEALED_MAX:
            _, handle = self._sealed.popitem(last=False)
            handle.close()

    def locate(self, position: int) -> int:
        """Start of the segment holding `position`."""
        i = bisect.bisect_right(self._starts, position) - 1
        if i < 0 or position >= self.end_position:
            raise CorruptRecordError(f"log position {position} is outside the log")
        return self._starts[i]

    def read(self, position: int, size: int) -> bytes:
        """Bytes [position, position + size), all within one segment."""
        start = self.locate(position)
        data = self._handle(start).pread(position - start, size)
        if len(data) != size:
            raise CorruptRecordError(
                f"short read at log position {position}: {len(data)} of {size} bytes"
            )
        return data

    def read_segment_tail(self, start: int, from_position: int, size: int) -> bytes:
        """Up to `size` bytes of segment `start` from `from_position` (recovery scans)."""
        return self._handle(start).pread(from_position - start, size)

    def segment_file_size(self, start: int) -> int:
        return self._handle(start).size()

    # ------------------------------------------------------------------ deleting

    def delete_segments_before(self, position: int) -> list[int]:
        """Delete whole sealed segments that end at or before `position`."""
        deleted = []
        while len(self._starts) > 1 and self._starts[1] <= position:
            start = self._starts.pop(0)
            handle = self._sealed.pop(start, None)
            if handle is not None:
                handle.close()
            self._fs.remove(self._path(start))
            deleted.append(start)
        if deleted:
            self._fs.sync_dir(self._dir)
        return deleted

    def close(self) -> None:
        for handle in self._sealed.values():
            handle.close()
        self._sealed.clear()
        self._active.close()
