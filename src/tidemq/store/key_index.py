"""The broker's key index: which messages carry a key, RocketMQ's IndexFile for tidemq.

Every message's `key` and each of its `keys`, in every topic that does not opt out
(topic config ``key.index=false``), gets one 40-byte entry (layout in
`format.key_entry`): (key hash, topic id, queue, the message's own offset, its record's
log position and store time). A batch of N keyed messages adds N entries, each naming
its message's offset in the batch (base + i).

Files, in ``<data_dir>/keyindex/``:

* one open file: its entries are in memory too (a lookup scans them with numpy), and are
  appended to the file at each checkpoint, as the queue indexes' are. Recovery cuts the
  entries at or past the checkpoint's position and re-derives them from the log.
* sealed files: at the first checkpoint after the open file holds
  `entries_per_file` entries it is written out sorted by hash, with a sparse fence of
  hashes (a lookup reads one block of `FENCE_STRIDE` entries per file), and a new open
  file begins. Sealed files are never changed.

Bounded: sealed files are deleted oldest first once they and a full open file would hold
more than `max_entries` entries, and as soon as retention has deleted every commit-log
segment they point into. A key older than that is no longer found by key (it is still
found by offset or time while stored).

Derived, never trusted: an entry is a candidate only. `store/key_lookup.py` reads the
message each names and keeps it only if it is still stored (not removed by retention or
compaction) and really carries the key (hashes collide).

Single writer: the store's owner serialises every call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c
import numpy as np
import numpy.typing as npt

from tidemq.core.batch import Envelope, binary_values, decode_columns, may_have_keys
from tidemq.core.properties import INTERNAL_PREFIX
from tidemq.store.files import FileSystem, ensure_dir
from tidemq.store.format.key_entry import (
    CRC_SLICE,
    ENTRY,
    ENTRY_DTYPE,
    FOOTER,
    MAGIC,
    OPEN_SUFFIX,
    SEALED_SUFFIX,
    VERSION,
    column_hashes,
    entry_array,
    entry_bytes,
)

__all__ = [
    "FENCE_STRIDE",
    "KEY_INDEX_CONFIG",
    "BatchKeys",
    "KeyIndex",
    "batch_keys",
    "indexes_topic",
]

log = logging.getLogger(__name__)

_W = ENTRY.size
#: Entries per fence step of a sealed file: a lookup reads about this many entries
#: (10 KiB) per file, and the fence costs 8 bytes per this many entries in memory.
FENCE_STRIDE = 256
#: The topic config that opts a topic out of the key index (Kafka-style dotted name).
KEY_INDEX_CONFIG = "key.index"
_TMP = ".tmp"


def indexes_topic(name: str, config: Mapping[str, str]) -> bool:
    """Whether a topic's messages go into the key index: every topic unless it opts out,
    but for the broker's own system topics (%SYS%...: timer, half, op and pop records,
    whose batches are indexed when they reach their real topic). Retry and dead-letter
    topics are indexed: a message is looked for there too."""
    if name.startswith(INTERNAL_PREFIX):
        return False
    return config.get(KEY_INDEX_CONFIG, "true").lower() != "false"


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """The keys of one batch: its `key` column's non-empty entries (message `rows`, with
    their hashes computed together) and its distinct `keys` items other than the key."""

    rows: npt.NDArray[np.intp]
    hashes: npt.NDArray[np.uint64]
    items: list[tuple[int, bytes]]

    def __len__(self) -> int:
        return len(self.rows) + len(self.items)


_NO_KEYS: Final = BatchKeys(np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.uint64), [])


def batch_keys(payload: bytes | memoryview, envelope: Envelope) -> BatchKeys:
    """The keys of a version-1 batch: each message's `key` (when non-empty) and each of
    its distinct `keys` other than that one (UTF-8 bytes). A batch without any costs a
    probe of its section sizes, not a decode; the key column is hashed with numpy, not
    key by key."""
    if not may_have_keys(payload, envelope):
        return _NO_KEYS
    columns = decode_columns(payload, verify_crc=False)
    key = columns.key
    offsets = key.offsets
    present = offsets[1:] > offsets[:-1]
    if key.validity is not None:
        present &= key.validity
    rows = np.flatnonzero(present)
    data = np.frombuffer(key.data, dtype=np.uint8)
    hashes = column_hashes(offsets, data, rows)
    items: list[tuple[int, bytes]] = []
    bounds = columns.keys.list_offsets.tolist()
    if bounds[-1]:
        keys = binary_values(key)
        values = binary_values(columns.keys.items)
        for i in range(columns.count):
            if bounds[i] == bounds[i + 1]:
                continue
            for item in dict.fromkeys(values[bounds[i] : bounds[i + 1]]):
                if item and item != keys[i]:
                    items.append((i, item))
    return BatchKeys(rows, hashes, items)


@dataclass(slots=True)
class _Sealed:
    path: Path
    count: int
    stride: int
    first_position: int
    last_position: int
    first_time_ms: int
    last_time_ms: int
    fence: npt.NDArray[np.uint64] | None = None  # loaded on the first lookup


def _file_name(position: int, suffix: str) -> str:
    return f"{position:020d}{suffix}"


def _position_of(name: str, suffix: str) -> int | None:
    stem = name[: -len(suffix)]
    return int(stem) if name.endswith(suffix) and stem.isdigit() else None


class KeyIndex:
    """The key index of one store (see the module docstring)."""

    def __init__(
        self, fs: FileSystem, directory: Path, *, entries_per_file: int, max_entries: int
    ) -> None:
        self._fs = fs
        self._dir = directory
        self._per_file = entries_per_file
        self._max_entries = max_entries
        ensure_dir(fs, directory)
        self._sealed: list[_Sealed] = []
        self._open_entries = bytearray()
        self._written = 0  # bytes of _open_entries already in the open file
        self._open_path: Path | None = None
        self._load()

    # ------------------------------------------------------------------ opening

    def _load(self) -> None:
        names = self._fs.listdir(self._dir)
        sealed = {p for n in names if (p := _position_of(n, SEALED_SUFFIX)) is not None}
        opened = sorted(p for n in names if (p := _position_of(n, OPEN_SUFFIX)) is not None)
        removed = False
        for name in names:
            if name.endswith(_TMP):  # a seal that crashed before its rename
                self._fs.remove(self._dir / name)
                removed = True
        for position in sorted(sealed):
            found = self._open_sealed(self._dir / _file_name(position, SEALED_SUFFIX))
            if found is None:
                removed = True
            else:
                self._sealed.append(found)
        for position in opened:
            path = self._dir / _file_name(position, OPEN_SUFFIX)
            if position in sealed or position != opened[-1]:
                # Sealed already: the crash came between the rename and this removal.
                self._fs.remove(path)
                removed = True
        if removed:
            self._fs.sync_dir(self._dir)
        if opened and opened[-1] not in sealed:
            self._open_path = self._dir / _file_name(opened[-1], OPEN_SUFFIX)
            raw = self._fs.read_bytes(self._open_path)
            self._open_entries = bytearray(raw[: len(raw) - len(raw) % _W])
            self._written = len(raw)  # a torn entry is cut by cut_from_position

    def _open_sealed(self, path: Path) -> _Sealed | None:
        """A sealed file's footer, checked; a damaged file is removed (its keys are no
        longer found: derived data, logged, never served from a bad fence)."""
        handle = self._fs.open(path)
        try:
            size = handle.size()
            footer = handle.pread(size - FOOTER.size, FOOTER.size) if size >= FOOTER.size else b""
            problem = _footer_problem(footer, size)
            if problem is None:
                fields = FOOTER.unpack(footer)
                count, stride = fields[5], fields[4]
                fence = handle.pread(count * _W, size - FOOTER.size - count * _W)
                if _crc(footer, fence) != fields[3]:
                    problem = "CRC mismatch"
        finally:
            handle.close()
        if problem is not None:
            log.warning("key index file %s is damaged (%s): removed", path, problem)
            self._fs.remove(path)
            return None
        return _Sealed(path, count, stride, fields[6], fields[7], fields[8], fields[9])

    def cut_from_position(self, position: int) -> None:
        """Recovery: drop the open file's entries of records at or past `position` (the
        checkpoint's): the log past it is replayed into the index again."""
        entries = np.frombuffer(self._open_entries, dtype=ENTRY_DTYPE)
        keep = int(np.searchsorted(entries["log_position"], np.uint64(position), side="left"))
        del entries
        if keep * _W == len(self._open_entries) == self._written:
            return
        del self._open_entries[keep * _W :]
        if self._open_path is not None:
            handle = self._fs.open(self._open_path)
            try:
                handle.truncate(keep * _W)
                handle.sync()
            finally:
                handle.close()
        self._written = keep * _W

    @property
    def covered_position(self) -> int:
        """Records before this position are in sealed files: a replay from an older
        checkpoint (a crash between a seal and its checkpoint) must not add them again."""
        return self._sealed[-1].last_position + 1 if self._sealed else 0

    # ------------------------------------------------------------------ writing

    def add(
        self,
        keys: BatchKeys,
        *,
        base_offset: int,
        log_position: int,
        store_time_ms: int,
        topic_id: int,
        queue_id: int,
    ) -> None:
        """Entries for the keys of one record (`batch_keys`)."""
        where = {
            "base_offset": base_offset,
            "log_position": log_position,
            "store_time_ms": store_time_ms,
            "topic_id": topic_id,
            "queue_id": queue_id,
        }
        if len(keys.rows):
            self._open_entries += entry_array(keys.rows, keys.hashes, **where).tobytes()
        if keys.items:
            self._open_entries += entry_bytes(keys.items, **where)

    @property
    def entry_count(self) -> int:
        """Entries in sealed files and the open one."""
        return sum(s.count for s in self._sealed) + len(self._open_entries) // _W

    @property
    def file_count(self) -> int:
        return len(self._sealed) + (self._open_path is not None)

    def write_pending(self) -> Path | None:
        """At a checkpoint: append the entries not yet in the open file; the file written,
        if any (the caller makes it durable with the queue indexes, `fs.sync_files`)."""
        if self._written == len(self._open_entries):
            return None
        if self._open_path is None:
            first = int(
                np.frombuffer(self._open_entries[:_W], dtype=ENTRY_DTYPE)["log_position"][0]
            )
            self._open_path = self._dir / _file_name(first, OPEN_SUFFIX)
            self._fs.open(self._open_path, create=True).close()
            self._fs.sync_dir(self._dir)
        handle = self._fs.open(self._open_path)
        try:
            size = handle.size()
            try:
                handle.append((memoryview(self._open_entries)[self._written :],))
            except OSError:
                handle.truncate(size)  # no partial entry left behind for the retry
                raise
        finally:
            handle.close()
        self._written = len(self._open_entries)
        return self._open_path

    def seal_if_full(self) -> bool:
        """After a checkpoint made the open file durable: seal it once it holds
        `entries_per_file` entries, then drop the oldest sealed files over the bound.
        Every entry is of a flushed record then, so a sealed file never names a record
        that a crash could take back."""
        count = len(self._open_entries) // _W
        if count < self._per_file or self._written != len(self._open_entries):
            return False
        assert self._open_path is not None
        entries = np.frombuffer(self._open_entries, dtype=ENTRY_DTYPE)
        order = np.lexsort((entries["offset"], entries["log_position"], entries["key_hash"]))
        ordered = entries[order]
        fence = np.ascontiguousarray(ordered["key_hash"][::FENCE_STRIDE])
        first, last = entries[0], entries[-1]
        footer = FOOTER.pack(
            MAGIC, VERSION, 0, 0, FENCE_STRIDE, count,
            int(first["log_position"]), int(last["log_position"]),
            int(first["store_time_ms"]), int(last["store_time_ms"]),
        )  # fmt: skip
        crc = _crc(footer, fence.tobytes()).to_bytes(4, "little")
        footer = footer[: CRC_SLICE.start] + crc + footer[CRC_SLICE.stop :]
        target = self._dir / _file_name(int(first["log_position"]), SEALED_SUFFIX)
        tmp = target.with_name(target.name + _TMP)
        handle = self._fs.open(tmp, create=True)
        try:
            handle.truncate(0)
            handle.append((ordered.tobytes(), fence.tobytes(), footer))
            handle.sync()
        finally:
            handle.close()
        self._fs.replace(tmp, target)
        self._fs.sync_dir(self._dir)
        self._fs.remove(self._open_path)
        self._fs.sync_dir(self._dir)
        del entries
        self._sealed.append(
            _Sealed(
                target, count, FENCE_STRIDE,
                int(first["log_position"]), int(last["log_position"]),
                int(first["store_time_ms"]), int(last["store_time_ms"]),
                fence,
            )
        )  # fmt: skip
        self._open_entries = bytearray()
        self._written = 0
        self._open_path = None
        self._drop_over_bound()
        return True

    def _drop_over_bound(self) -> None:
        while self._sealed and sum(s.count for s in self._sealed) + self._per_file > (
            self._max_entries
        ):
            self._remove(self._sealed[0], "over store.key_index_max_entries")

    def drop_before(self, log_start: int) -> int:
        """Retention deleted the log before `log_start`: remove the sealed files that
        point only there. Returns how many."""
        dropped = 0
        while self._sealed and self._sealed[0].last_position < log_start:
            self._remove(self._sealed[0], "its commit-log segments are deleted")
            dropped += 1
        return dropped

    def _remove(self, sealed: _Sealed, why: str) -> None:
        log.info("key index file %s removed: %s", sealed.path.name, why)
        self._sealed.remove(sealed)
        self._fs.remove(sealed.path)
        self._fs.sync_dir(self._dir)

    # ------------------------------------------------------------------ lookups

    def candidates(
        self, topic_id: int, key_hash: int, start_ms: int, end_ms: int
    ) -> npt.NDArray[np.void]:
        """Entries of `key_hash` in topic `topic_id` stored in [start_ms, end_ms], newest
        first (by log position, then offset). Candidates only: hashes collide."""
        parts = [self._open_matches(key_hash)]
        for sealed in reversed(self._sealed):
            if sealed.last_time_ms < start_ms or sealed.first_time_ms > end_ms:
                continue
            parts.append(self._sealed_matches(sealed, key_hash))
        found = np.concatenate(parts)
        found = found[
            (found["topic_id"] == topic_id)
            & (found["store_time_ms"] >= start_ms)
            & (found["store_time_ms"] <= end_ms)
        ]
        order = np.lexsort((found["offset"], found["log_position"]))[::-1]
        newest_first: npt.NDArray[np.void] = found[order]
        return newest_first

    def _open_matches(self, key_hash: int) -> npt.NDArray[np.void]:
        entries = np.frombuffer(self._open_entries, dtype=ENTRY_DTYPE)
        matches: npt.NDArray[np.void] = entries[entries["key_hash"] == np.uint64(key_hash)]
        return matches

    def _sealed_matches(self, sealed: _Sealed, key_hash: int) -> npt.NDArray[np.void]:
        fence = self._fence(sealed)
        wanted = np.uint64(key_hash)
        lo_block = max(int(np.searchsorted(fence, wanted, side="left")) - 1, 0)
        hi_block = int(np.searchsorted(fence, wanted, side="right"))
        first = lo_block * sealed.stride
        end = min(hi_block * sealed.stride, sealed.count)
        if end <= first:
            return np.empty(0, dtype=ENTRY_DTYPE)
        handle = self._fs.open(sealed.path)
        try:
            raw = handle.pread(first * _W, (end - first) * _W)
        finally:
            handle.close()
        block = np.frombuffer(raw[: len(raw) - len(raw) % _W], dtype=ENTRY_DTYPE)
        matches: npt.NDArray[np.void] = block[block["key_hash"] == wanted]
        return matches

    def _fence(self, sealed: _Sealed) -> npt.NDArray[np.uint64]:
        if sealed.fence is None:
            handle = self._fs.open(sealed.path)
            try:
                size = handle.size()
                start = sealed.count * _W
                raw = handle.pread(start, size - FOOTER.size - start)
            finally:
                handle.close()
            sealed.fence = np.frombuffer(raw, dtype="<u8")
        return sealed.fence

    def sealed_files(self) -> Iterator[tuple[Path, int]]:
        """(path, entries) of each sealed file, oldest first (for status and tests)."""
        for s in self._sealed:
            yield s.path, s.count


def _crc(footer: bytes, fence: bytes) -> int:
    """The footer's CRC: over the fence, then the footer but its CRC field."""
    crc = crc32c.crc32c(footer[: CRC_SLICE.start], crc32c.crc32c(fence))
    return crc32c.crc32c(footer[CRC_SLICE.stop :], crc)


def _footer_problem(footer: bytes, size: int) -> str | None:
    if len(footer) != FOOTER.size:
        return "shorter than its footer"
    magic, version, _, _, stride, count, *_ = FOOTER.unpack(footer)
    if magic != MAGIC or version != VERSION:
        return "bad magic or version"
    if stride <= 0:
        return "bad fence stride"
    fence_entries = -(-count // stride)
    if size != count * _W + fence_entries * 8 + FOOTER.size:
        return "size does not match its footer"
    return None
