"""Per-queue index: one fixed-width entry per batch (`format.index_entry`).

Files live in the queue's directory, named by the base offset of their first entry
(20 digits + ``.idx``), each holding at most `entries_per_file` entries. The last file's
entries are also kept in memory (`_tail`), loaded on first use, so appends and lookups of
recent offsets never touch the disk. Entries are written to the file only at checkpoints
(`write_pending`); until then they exist in memory and are re-derived from the commit log
after a crash. Sealed files are read whole into a shared LRU cache for lookups.

Derived, never trusted: recovery cuts every entry at or past the checkpoint's indexed
position (`cut_from_position`) and re-appends them from the log.

Single writer: the store's owner serialises every call.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tidemq.store.files import FileSystem
from tidemq.store.format.index_entry import ENTRY, ENTRY_DTYPE

__all__ = ["IndexEntry", "IndexFileCache", "QueueIndex"]

_SUFFIX = ".idx"
_W = ENTRY.size
#: `iter_entries` unpacks this many entries first, doubling up to _CHUNK_MAX.
_CHUNK_FIRST = 32
_CHUNK_MAX = 1024


@dataclass(frozen=True, slots=True)
class IndexEntry:
    log_position: int
    size: int
    count: int
    base_offset: int
    store_time_ms: int
    tag_summary: int


class IndexFileCache:
    """Sealed index files in memory, least recently used dropped first."""

    def __init__(self, max_files: int) -> None:
        self._max = max_files
        self._files: OrderedDict[Path, npt.NDArray[np.void]] = OrderedDict()

    def get(self, fs: FileSystem, path: Path) -> npt.NDArray[np.void]:
        arr = self._files.get(path)
        if arr is None:
            raw = fs.read_bytes(path)
            raw = raw[: len(raw) - len(raw) % _W]
            arr = np.frombuffer(raw, dtype=ENTRY_DTYPE)
            self._files[path] = arr
            while len(self._files) > self._max:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(path)
        return arr

    def drop(self, path: Path) -> None:
        self._files.pop(path, None)


def _file_name(first_offset: int) -> str:
    return f"{first_offset:020d}{_SUFFIX}"


class QueueIndex:
    """The index of one queue."""

    def __init__(
        self, fs: FileSystem, directory: Path, *, entries_per_file: int, cache: IndexFileCache
    ) -> None:
        self._fs = fs
        self._dir = directory
        self._per_file = entries_per_file
        self._cache = cache
        self._path_memo: tuple[int, Path] = (-1, directory)
        # The directory is made with the first index file: a queue never written costs no
        # directory, no fsync (creating 100,000 topics would otherwise sync 200,000
        # directory entries, and every start would sync them again).
        self._exists = fs.exists(directory)
        #: Directories whose entries (a new directory, a new index file) are not synced
        #: yet: the next checkpoint syncs them (`take_unsynced_dirs`), not the produce
        #: that rolled the file. Until that checkpoint the entries are re-derived from
        #: the log after a crash anyway.
        self._unsynced_dirs: list[Path] = []
        #: Whether the newest file exists on disk yet (see `_roll`).
        self._last_on_disk = True
        self._files: list[int] = sorted(
            int(n[: -len(_SUFFIX)])
            for n in (fs.listdir(directory) if self._exists else ())
            if n.endswith(_SUFFIX) and n[: -len(_SUFFIX)].isdigit()
        )
        self._tail: bytearray | None = None  # entries of the last file, loaded lazily
        self._tail_bases: array[int] = array("q")
        self._tail_written = 0  # tail entries already in the file
        self._next_offset = 0
        self._last_position = -1
        self.min_offset = 0
        self._load_bounds()

    # ------------------------------------------------------------------ state

    def _path(self, first: int) -> Path:
        # Remembers the last one: each checkpoint asks for the newest file's path again,
        # and building a Path costs more than the write (thousands of queues per checkpoint).
        if self._path_memo[0] != first:
            self._path_memo = (first, self._dir / _file_name(first))
        return self._path_memo[1]

    def _load_bounds(self) -> None:
        """Set next_offset and last_position from the files (the newest whole entry)."""
        self._last_position = -1
        if not self._files:
            return
        self._next_offset = self._files[-1]  # an empty last file: its name is the next offset
        for i, first in enumerate(reversed(self._files)):
            handle = self._fs.open(self._path(first))
            try:
                size = handle.size() - handle.size() % _W
                if size == 0:
                    continue
                entry = IndexEntry(*ENTRY.unpack(handle.pread(size - _W, _W)))
            finally:
                handle.close()
            if i == 0:
                self._next_offset = entry.base_offset + entry.count
            self._last_position = entry.log_position
            break
        self.min_offset = self._files[0]

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets (max offset + 1)."""
        return self._next_offset

    @property
    def last_position(self) -> int:
        """Log position of the newest entry, -1 if none."""
        return self._last_position

    def _load_tail(self) -> bytearray:
        if self._tail is None:
            self._tail = bytearray()
            self._tail_bases = array("q")
            if self._files:
                raw = self._fs.read_bytes(self._path(self._files[-1]))
                raw = raw[: len(raw) - len(raw) % _W]
                self._tail += raw
                self._tail_bases.extend(
                    int(b) for b in np.frombuffer(raw, dtype=ENTRY_DTYPE)["base_offset"]
                )
                self._tail_written = len(self._tail_bases)
        return self._tail

    # ------------------------------------------------------------------ writing

    def append(
        self, log_position: int, size: int, count: int, store_time_ms: int, tag_summary: int
    ) -> int:
        """Add the entry for a batch at the next offset; return its base offset."""
        assert log_position > self._last_position
        tail = self._load_tail()
        if not self._files or len(self._tail_bases) >= self._per_file:
            self._roll()
            tail = self._load_tail()
        base = self._next_offset
        tail += ENTRY.pack(log_position, size, count, base, store_time_ms, tag_summary)
        self._tail_bases.append(base)
        self._next_offset = base + count
        self._last_position = log_position
        return base

    def _roll(self) -> None:
        if self._files:
            self.write_pending(sync=True)
        # The new file is made when its first entries are written (`write_pending`, at a
        # checkpoint or the next roll), not here: the first message to a queue touches no
        # file system (entries live in memory until a checkpoint anyway).
        self._files.append(self._next_offset)
        self._last_on_disk = False
        self._tail = bytearray()
        self._tail_bases = array("q")
        self._tail_written = 0

    def _make_dir(self) -> None:
        missing = []
        probe = self._dir
        while not self._fs.exists(probe) and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        self._fs.makedirs(self._dir)
        self._unsynced_dirs.extend(created.parent for created in reversed(missing))
        self._exists = True

    def take_unsynced_dirs(self) -> list[Path]:
        """The directories to sync before a checkpoint counts on this index's files."""
        dirs, self._unsynced_dirs = self._unsynced_dirs, []
        return dirs

    def has_pending(self) -> bool:
        return self._tail is not None and self._tail_written < len(self._tail_bases)

    def write_pending(self, *, sync: bool) -> Path | None:
        """Write the in-memory entries not yet in the file (at checkpoints); the file
        written, if any. Without `sync` the caller makes it durable (`fs.sync_files`)."""
        if not self.has_pending():
            return None
        assert self._tail is not None
        path = self._path(self._files[-1])
        if not self._last_on_disk:
            if not self._exists:
                self._make_dir()
            if self._dir not in self._unsynced_dirs:  # the new file's entry
                self._unsynced_dirs.append(self._dir)
        handle = self._fs.open(path, create=not self._last_on_disk)
        self._last_on_disk = True
        try:
            size = handle.size()
            try:
                handle.append((memoryview(self._tail)[self._tail_written * _W :],))
            except OSError:
                # Out of space midway (ENOSPC): take the partial entries back out, or the
                # next try would append after them and shift every entry that follows.
                handle.truncate(size)
                raise
            if sync:
                handle.sync()
        finally:
            handle.close()
        self._tail_written = len(self._tail_bases)
        return path

    # ------------------------------------------------------------------ reading

    def _file_array(self, file_index: int) -> npt.NDArray[np.void]:
        if file_index == len(self._files) - 1:
            tail = self._load_tail()
            return np.frombuffer(bytes(tail), dtype=ENTRY_DTYPE)
        return self._cache.get(self._fs, self._path(self._files[file_index]))

    def entries_array_from(self, offset: int, max_entries: int) -> npt.NDArray[np.void]:
        """`iter_entries` as one array (a copy, no object per entry): for scans of many
        entries (compaction's dirty ranges)."""
        offset = max(offset, self.min_offset)
        if offset >= self._next_offset or not self._files:
            return np.zeros(0, dtype=ENTRY_DTYPE)
        fi = max(bisect.bisect_right(self._files, offset) - 1, 0)
        parts: list[npt.NDArray[np.void]] = []
        left = max_entries
        while fi < len(self._files) and left > 0:
            arr = self._file_array(fi)
            if not parts:
                i = int(np.searchsorted(arr["base_offset"], offset, side="right")) - 1
                arr = arr[max(i, 0) :]
            parts.append(arr[:left])
            left -= len(parts[-1])
            fi += 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=ENTRY_DTYPE)

    def entries_from(self, offset: int, max_entries: int) -> list[IndexEntry]:
        """Entries starting with the one whose batch holds `offset`, in offset order."""
        return list(self.iter_entries(offset, max_entries))

    def iter_entries(self, offset: int, max_entries: int) -> Iterator[IndexEntry]:
        """`entries_from`, unpacked lazily in growing chunks: a reader that stops after a
        few entries (a read's byte budget) does not pay for `max_entries` of them. The
        index must not change while the iterator is in use."""
        # Clamp first: with min_offset == next_offset (all retained away) an offset below
        # it must find nothing, not the last batch below the minimum.
        offset = max(offset, self.min_offset)
        if offset >= self._next_offset or not self._files:
            return
        fi = max(bisect.bisect_right(self._files, offset) - 1, 0)
        left = max_entries
        chunk = _CHUNK_FIRST
        while fi < len(self._files) and left > 0:
            in_tail = fi == len(self._files) - 1
            if in_tail:
                tail = self._load_tail()
                i = max(bisect.bisect_right(self._tail_bases, offset) - 1, 0)
                stop = min(len(self._tail_bases), i + left)
            else:
                arr = self._file_array(fi)
                i = max(int(np.searchsorted(arr["base_offset"], offset, side="right")) - 1, 0)
                stop = min(len(arr), i + left)
            while i < stop:
                j = min(stop, i + chunk)
                # Copies (never views): the tail bytearray must stay resizable.
                raw = bytes(tail[i * _W : j * _W]) if in_tail else arr[i:j].tobytes()
                for fields in ENTRY.iter_unpack(raw):
                    entry = IndexEntry(*fields)
                    offset = entry.base_offset + entry.count
                    yield entry
                left -= j - i
                i = j
                chunk = min(chunk * 2, _CHUNK_MAX)
            fi += 1

    def offset_for_time(self, timestamp_ms: int) -> int:
        """First offset stored at or after `timestamp_ms` (next_offset if none)."""
        for fi in range(len(self._files)):
            arr = self._file_array(fi)
            if len(arr) == 0 or int(arr["store_time_ms"][-1]) < timestamp_ms:
                continue
            i = int(np.searchsorted(arr["store_time_ms"], timestamp_ms, side="left"))
            return max(int(arr["base_offset"][i]), self.min_offset)
        return self._next_offset

    def store_time_before(self, log_position: int) -> int:
        """The store time of the newest entry before `log_position` (0: none)."""
        for file_index in range(len(self._files) - 1, -1, -1):
            arr = self._file_array(file_index)
            kept = int(np.searchsorted(arr["log_position"], log_position, side="left"))
            if kept > 0:
                return int(arr["store_time_ms"][kept - 1])
        return 0

    def first_entry(self) -> IndexEntry | None:
        got = self.entries_from(self.min_offset, 1)
        return got[0] if got else None

    def all_entries(self) -> npt.NDArray[np.void]:
        """Every entry still on file or in memory (retention and tests)."""
        if not self._files:
            return np.zeros(0, dtype=ENTRY_DTYPE)
        return np.concatenate([self._file_array(i) for i in range(len(self._files))])

    def offset_at_position(self, log_position: int) -> int:
        """The offset of the queue's first record at or after `log_position` (its next
        offset when none is): where the queue continues in a log that starts there."""
        if self._files:
            # Most queues' first entry is already at or past it (retention deletes a
            # segment only below every queue's first kept record): one file read.
            first = self._file_array(0)
            if len(first) and int(first[0]["log_position"]) >= log_position:
                return int(first[0]["base_offset"])
        entries = self.all_entries()
        i = int(np.searchsorted(entries["log_position"], np.uint64(log_position), side="left"))
        return int(entries[i]["base_offset"]) if i < len(entries) else self._next_offset

    # ------------------------------------------------------------------ trimming

    def advance_min_offset(self, offset: int) -> None:
        """Retention: offsets below `offset` are gone. Whole files below it are deleted."""
        offset = min(max(offset, self.min_offset), self._next_offset)
        self.min_offset = offset
        removed = False
        while len(self._files) > 1 and self._files[1] <= offset:
            first = self._files.pop(0)
            self._cache.drop(self._path(first))
            self._fs.remove(self._path(first))
            removed = True
        if removed:
            self._fs.sync_dir(self._dir)

    def cut_from_position(self, position: int) -> None:
        """Recovery: drop every entry at or past log `position` (and torn partial entries).

        The queue then continues at the first dropped offset, which replay re-derives.
        """
        self._tail = None
        min_offset = self.min_offset
        changed = False
        while self._files:
            path = self._path(self._files[-1])
            self._cache.drop(path)
            raw = self._fs.read_bytes(path)
            arr = np.frombuffer(raw[: len(raw) - len(raw) % _W], dtype=ENTRY_DTYPE)
            keep = _trusted_prefix(arr, self._files[-1], position)
            if keep == 0 and len(self._files) > 1:
                self._fs.remove(path)
                self._files.pop()
                changed = True
                continue
            if keep * _W != len(raw):
                handle = self._fs.open(path)
                try:
                    handle.truncate(keep * _W)
                    handle.sync()
                finally:
                    handle.close()
            break
        if changed:  # only removals change the directory (a queue left whole syncs nothing)
            self._fs.sync_dir(self._dir)
        self._load_bounds()
        self.min_offset = min(max(min_offset, self.min_offset), self._next_offset)

    def reset(self, next_offset: int) -> None:
        """Recovery of a damaged index: remove every file; the queue continues at
        `next_offset` (nothing below it readable) and re-appended entries rebuild it."""
        on_disk = self._files if self._last_on_disk else self._files[:-1]
        for first in self._files:
            self._cache.drop(self._path(first))
        for first in on_disk:
            self._fs.remove(self._path(first))
        if on_disk:
            self._fs.sync_dir(self._dir)
        self._files = []
        self._last_on_disk = True
        self._tail = None
        self._next_offset = self.min_offset = next_offset
        self._last_position = -1

    def delete(self) -> None:
        for first in self._files:
            self._cache.drop(self._path(first))
        if self._exists or self._fs.exists(self._dir):
            self._fs.remove_tree(self._dir)
        self._exists = False
        self._last_on_disk = True
        self._files = []
        self._tail = None


def _trusted_prefix(arr: npt.NDArray[np.void], first_offset: int, position: int) -> int:
    """How many leading entries of an index file recovery may keep.

    Entries before the checkpoint were synced before it was written, so they are whole.
    Entries written after it may be torn or garbage after a power loss, in any order, so
    the kept prefix stops at the first entry that points at or past `position` or does not
    continue its predecessor (offsets contiguous from the file's name, positions rising).
    """
    n = len(arr)
    if n == 0:
        return 0
    pos = arr["log_position"]
    base = arr["base_offset"]
    count = arr["count"]
    expected = np.empty(n, dtype=np.uint64)
    expected[0] = first_offset
    expected[1:] = base[:-1] + count[:-1]
    ok = (pos < position) & (base == expected) & (count > 0)
    ok[1:] &= pos[1:] > pos[:-1]
    return n if bool(ok.all()) else int(np.argmin(ok))
