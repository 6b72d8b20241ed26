"""A queue's compacted log: reading one generation, writing the next (layout in
`format.compacted`).

A file is written whole under a temporary name, synced, renamed and its directory synced
before anything names it (the metadata switch in `MessageStore`), so a named generation
is always complete; recovery removes every other file of the directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np
import numpy.typing as npt

from tidemq.core.errors import CorruptRecordError
from tidemq.store.files import FileHandle, FileSystem, ensure_dir
from tidemq.store.format.compacted import (
    ENTRY_DTYPE,
    FOOTER,
    KEY_DTYPE,
    MAGIC,
    SUFFIX,
    VERSION,
)

__all__ = [
    "CompactedLog",
    "CompactedLogWriter",
    "CompactedRecord",
    "CompactedSnapshot",
    "compacted_dir",
    "file_name",
]

#: Records buffered before one append (pwritev takes at most IOV_MAX = 1024 buffers).
_WRITE_BUFFERS = 512
_WRITE_BYTES = 4 << 20


def compacted_dir(queue_dir: Path) -> Path:
    return queue_dir / "compacted"


def file_name(generation: int) -> str:
    return f"{generation:020d}{SUFFIX}"


@dataclass(frozen=True, slots=True)
class CompactedRecord:
    """One record for a new compacted log, with its entry's fields."""

    record: bytes
    count: int
    base_offset: int
    end_offset: int
    store_time_ms: int
    tag_summary: int
    cleaned_ms: int
    tombstones: int


@dataclass(frozen=True, slots=True)
class CompactedSnapshot:
    """What a compaction run needs of the current generation (picklable, no handle)."""

    path: Path
    generation: int
    start: int
    end: int
    entries: npt.NDArray[np.void]

    def entries_from(self, offset: int) -> Iterator[npt.NDArray[np.void]]:
        """Entries holding offsets at or after `offset` (and at or after `start`)."""
        return _entries_from(self.entries, max(offset, self.start))


def _entries_from(entries: npt.NDArray[np.void], offset: int) -> Iterator[npt.NDArray[np.void]]:
    """The entries whose records hold offsets at or after `offset`, in order (the first
    is the one whose end is past it: holes are stepped over)."""
    ends = entries["end_offset"]
    i = int(np.searchsorted(ends, np.uint64(offset), side="right"))
    for j in range(i, len(entries)):
        yield entries[j]


class CompactedLog:
    """One generation of a queue's compacted log, open for reading.

    `start` is the queue's first offset (retention of a `compact,delete` topic may move it
    up; entries below it are no longer served), `end` the first offset the commit log
    serves. Entries and key index are loaded in memory; records are read on demand.
    """

    def __init__(
        self,
        *,
        handle: FileHandle,
        path: Path,
        generation: int,
        start: int,
        end: int,
        entries: npt.NDArray[np.void],
        keys: npt.NDArray[np.void],
    ) -> None:
        self._handle = handle
        self.path = path
        self.generation = generation
        self.start = start
        self.end = end
        self.entries = entries
        self.keys = keys
        #: Bytes of records (the "clean" size of the dirty ratio).
        self.size = int(entries["size"].sum()) if len(entries) else 0

    @classmethod
    def open(cls, fs: FileSystem, path: Path, *, generation: int, start: int) -> CompactedLog:
        """Open and check a named generation (CorruptRecordError if it is not whole)."""
        handle = fs.open(path)
        try:
            size = handle.size()
            if size < FOOTER.size:
                raise CorruptRecordError(f"compacted log {path} is too short")
            raw_footer = handle.pread(size - FOOTER.size, FOOTER.size)
            magic, version, _, crc, count, gen, entries_at, keys_at, end = FOOTER.unpack(raw_footer)
            if magic != MAGIC or version != VERSION or gen != generation:
                raise CorruptRecordError(f"compacted log {path} has a bad footer")
            if not entries_at <= keys_at <= size - FOOTER.size:
                raise CorruptRecordError(f"compacted log {path} has bad section positions")
            tail = handle.pread(entries_at, size - FOOTER.size - entries_at)
            if _crc(tail, raw_footer) != crc:
                raise CorruptRecordError(f"compacted log {path} fails its checksum")
            split = keys_at - entries_at
            if split != count * ENTRY_DTYPE.itemsize or (len(tail) - split) % KEY_DTYPE.itemsize:
                raise CorruptRecordError(f"compacted log {path} has bad section sizes")
            entries = np.frombuffer(tail[:split], dtype=ENTRY_DTYPE)
            keys = np.frombuffer(tail[split:], dtype=KEY_DTYPE)
        except BaseException:
            handle.close()
            raise
        return cls(
            handle=handle,
            path=path,
            generation=generation,
            start=min(start, end),
            end=end,
            entries=entries,
            keys=keys,
        )

    def snapshot(self) -> CompactedSnapshot:
        return CompactedSnapshot(self.path, self.generation, self.start, self.end, self.entries)

    def entries_from(self, offset: int) -> Iterator[npt.NDArray[np.void]]:
        """Entries holding offsets at or after `offset` (and at or after `start`)."""
        return _entries_from(self.entries, max(offset, self.start))

    def read(self, position: int, size: int) -> bytes:
        data = self._handle.pread(position, size)
        if len(data) != size:
            raise CorruptRecordError(f"compacted log {self.path} ends inside a record")
        return data

    def file_size(self) -> int:
        """The whole file's length (a follower starting over copies it as it is)."""
        return self._handle.size()

    def read_file(self, offset: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the file from `offset` (short at its end)."""
        return self._handle.pread(offset, max(0, min(max_bytes, self.file_size() - offset)))

    def candidates(self, key_hash: int) -> list[int]:
        """Offsets (newest first) of kept messages whose key has this hash."""
        hashes = self.keys["hash"]
        lo = int(np.searchsorted(hashes, key_hash, side="left"))
        hi = int(np.searchsorted(hashes, key_hash, side="right"))
        return [int(o) for o in self.keys["offset"][lo:hi][::-1] if o >= self.start]

    def entry_for(self, offset: int) -> npt.NDArray[np.void] | None:
        """The entry whose record may hold `offset`."""
        i = int(np.searchsorted(self.entries["end_offset"], np.uint64(offset), side="right"))
        if i == len(self.entries) or int(self.entries[i]["base_offset"]) > offset:
            return None
        entry: npt.NDArray[np.void] = self.entries[i]
        return entry

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """First kept offset stored at or after `timestamp_ms` (None: none is)."""
        times = self.entries["store_time_ms"]
        i = int(np.searchsorted(times, timestamp_ms, side="left"))
        if i == len(self.entries):
            return None
        return max(int(self.entries[i]["base_offset"]), self.start)

    def next_tombstone_expiry(self, delete_retention_ms: int) -> int | None:
        """When the first tombstone kept here may go (None: there is none)."""
        with_tombstones = self.entries["tombstones"] > 0
        if not with_tombstones.any():
            return None
        return int(self.entries["cleaned_ms"][with_tombstones].min()) + delete_retention_ms

    def close(self) -> None:
        self._handle.close()


def _crc(sections: bytes, footer: bytes) -> int:
    crc = crc32c.crc32c(sections)
    crc = crc32c.crc32c(footer[:8], crc)
    return crc32c.crc32c(footer[12:], crc)


class CompactedLogWriter:
    """Writes one generation: records as compaction produces them (buffered, appended in
    chunks), then `finish` adds entries, key index and footer, syncs and names the file.
    `abort` removes the temporary file of a run that failed."""

    def __init__(self, fs: FileSystem, directory: Path, generation: int) -> None:
        ensure_dir(fs, directory)
        self._fs = fs
        self._dir = directory
        self.generation = generation
        self.path = directory / file_name(generation)
        self._tmp = self.path.with_suffix(SUFFIX + ".tmp")
        self._handle = fs.open(self._tmp, create=True)
        self._handle.truncate(0)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._entries: list[tuple[int, ...]] = []
        self._position = 0

    def add(self, r: CompactedRecord) -> None:
        self._entries.append(
            (
                self._position,
                len(r.record),
                r.count,
                r.base_offset,
                r.end_offset,
                r.store_time_ms,
                r.tag_summary,
                r.cleaned_ms,
                r.tombstones,
                0,
            )
        )
        self._position += len(r.record)
        self._pending.append(r.record)
        self._pending_bytes += len(r.record)
        if len(self._pending) >= _WRITE_BUFFERS or self._pending_bytes >= _WRITE_BYTES:
            self._write()

    def _write(self) -> None:
        if self._pending:
            self._handle.append(self._pending)
            self._pending, self._pending_bytes = [], 0

    def finish(self, end: int, keys: npt.NDArray[np.void]) -> Path:
        """Seal and name the file; `keys` sorted by (hash, offset). Returns its path."""
        self._write()
        entries = np.array(self._entries, dtype=ENTRY_DTYPE)
        sections = entries.tobytes() + keys.tobytes()
        keys_at = self._position + entries.nbytes
        footer = FOOTER.pack(
            MAGIC, VERSION, 0, 0, len(entries), self.generation, self._position, keys_at, end
        )
        crc = _crc(sections, footer)
        footer = footer[:8] + crc.to_bytes(4, "little") + footer[12:]
        try:
            self._handle.append([sections, footer])
            self._handle.sync()
        finally:
            self._handle.close()
        self._fs.replace(self._tmp, self.path)
        self._fs.sync_dir(self._dir)
        return self.path

    def abort(self) -> None:
        self._handle.close()
        if self._fs.exists(self._tmp):
            self._fs.remove(self._tmp)
