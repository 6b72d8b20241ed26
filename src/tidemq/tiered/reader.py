"""Reads of offloaded offsets: ranged GETs of row groups, rebuilt into stored records.

A read of offset X finds X's file in the queue's manifest and X's row group in the file's
`row_groups`, then fetches that row group's byte span with one ranged GET (plus, once per
file, the footer), decodes it (Parquet page checksums checked) and rebuilds the records
(`parquet_rows.table_to_records`). Rebuilt row groups are kept in an LRU cache bounded by
`tiered.cache_bytes`, so a sequential reader and a reader that re-reads cost one GET per
row group. `warm` fetches a row group ahead for a sequential reader.

Methods block (network and decoding): the broker runs them on worker threads. They raise
`ObjectMissing` for a file the manifest lists but the store does not hold (the broker
reports data loss) and `TierUnavailable` for any other failure (retriable).
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidemq.core.errors import CorruptRecordError, TierUnavailable
from tidemq.tiered.manifest import QueueManifest, RemoteFile
from tidemq.tiered.object_store import ObjectStore
from tidemq.tiered.parquet_rows import check_file_metadata, table_to_records

__all__ = ["TierReader"]

#: The tail fetched to find a file's footer in one GET (Parquet's own readers use 64 KiB).
_TAIL_BYTES: Final = 64 * 1024
#: Footers (file metadata) kept, by file.
_MAX_FOOTERS: Final = 1024
#: What a lookup by time reads of a row group.
_TIME_COLUMNS: Final = ["offset", "timestamp", "store_time_ms"]


class _SparseFile(io.RawIOBase):
    """A read-only file of `size` bytes of which some spans are in memory; a read outside
    them is a ranged GET (pyarrow reads through this as a file)."""

    def __init__(self, store: ObjectStore, path: str, size: int) -> None:
        self._store, self._path, self._size = store, path, size
        self._spans: list[tuple[int, bytes]] = []
        self._pos = 0

    def add(self, start: int, data: bytes) -> None:
        self._spans.append((start, data))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n == 0:
            return 0
        lo, hi = self._pos, self._pos + n
        for start, data in self._spans:
            if start <= lo and hi <= start + len(data):
                view[:n] = data[lo - start : hi - start]
                break
        else:
            got = self._store.get_range(self._path, lo, hi)
            if len(got) != n:
                raise TierUnavailable(f"{self._path}: short read at {lo} ({len(got)} of {n})")
            view[:n] = got
        self._pos = hi
        return n


@dataclass(frozen=True, slots=True)
class _Footer:
    metadata: Any  # pq.FileMetaData
    tail_start: int
    tail: bytes


class TierReader:
    def __init__(self, store: ObjectStore, cache_bytes: int) -> None:
        self._store = store
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._groups: OrderedDict[tuple[str, int], list[bytes]] = OrderedDict()
        self._cached = 0
        self._footers: OrderedDict[str, _Footer] = OrderedDict()
        #: GETs made and cache hits, for `tidemq tier status` and the tests.
        self.gets = 0
        self.hits = 0

    # ------------------------------------------------------------------ reading

    def read(
        self,
        manifest: QueueManifest,
        topic_id: int,
        offset: int,
        max_bytes: int,
        max_files: int = 2,
    ) -> list[bytes]:
        """Whole records from the one holding `offset`, up to `max_bytes` (at least one),
        within at most `max_files` files. Empty when `offset` is not remote."""
        out: list[bytes] = []
        budget = max_bytes
        file = manifest.file_for(offset)
        files = 0
        while file is not None and files < max_files and budget > 0:
            group = bisect.bisect_right(file.row_groups, offset) - 1
            for g in range(max(group, 0), len(file.row_groups)):
                try:
                    records = self.row_group(file, g, manifest, topic_id)
                except (TierUnavailable, CorruptRecordError):
                    if not out:
                        raise
                    return out  # what was read; the next read meets (and reports) this
                for record in records:
                    if _end_of(record) <= offset:
                        continue
                    if out and len(record) > budget:
                        return out
                    out.append(record)
                    budget -= len(record)
                if budget <= 0:
                    return out
            offset = file.end
            file = manifest.following(file)
            files += 1
        return out

    def row_group(
        self, file: RemoteFile, group: int, manifest: QueueManifest, topic_id: int
    ) -> list[bytes]:
        key = (file.path, group)
        with self._lock:
            hit = self._groups.get(key)
            if hit is not None:
                self._groups.move_to_end(key)
                self.hits += 1
                return hit
        records = self._fetch(file, group, manifest, topic_id)
        size = sum(len(r) for r in records)
        with self._lock:
            if key not in self._groups:
                self._groups[key] = records
                self._cached += size
            while self._cached > self._cache_bytes and len(self._groups) > 1:
                _, dropped = self._groups.popitem(last=False)
                self._cached -= sum(len(r) for r in dropped)
        return records

    def offset_for_time(self, manifest: QueueManifest, timestamp_ms: int) -> int | None:
        """The first remote offset stored at or after `timestamp_ms` whose message's
        timestamp is at or after it too; None if none is. Reads only the three columns
        it needs, of the row groups of the files that can hold it."""
        for file in manifest.files:
            if file.max_store_time_ms < timestamp_ms:
                continue
            for group in range(len(file.row_groups)):
                table = self._table(file, group, manifest, _TIME_COLUMNS)
                stored = table.column("store_time_ms").to_numpy()
                stamps = table.column("timestamp").cast(pa.int64()).to_numpy() // 1000
                hits = np.flatnonzero((stored >= timestamp_ms) & (stamps >= timestamp_ms))
                offsets = table.column("offset").to_numpy()
                hits = hits[offsets[hits] >= manifest.log_start]
                if len(hits):
                    return int(offsets[hits[0]])
        return None

    def warm(self, manifest: QueueManifest, topic_id: int, offset: int) -> None:
        """Fetch the row group holding `offset` into the cache (a sequential reader's next)."""
        file = manifest.file_for(offset)
        if file is not None:
            group = max(bisect.bisect_right(file.row_groups, offset) - 1, 0)
            self.row_group(file, group, manifest, topic_id)

    def drop(self, path: str) -> None:
        """Forget a file (deleted by retention)."""
        with self._lock:
            for key in [k for k in self._groups if k[0] == path]:
                self._cached -= sum(len(r) for r in self._groups.pop(key))
            self._footers.pop(path, None)

    @property
    def cached_bytes(self) -> int:
        return self._cached

    # ------------------------------------------------------------------ fetching

    def _footer(self, file: RemoteFile) -> _Footer:
        with self._lock:
            have = self._footers.get(file.path)
        if have is not None:
            return have
        tail_start = max(0, file.size - _TAIL_BYTES)
        tail = self._get(file, tail_start, file.size)
        sparse = _SparseFile(self._store, file.path, file.size)
        sparse.add(tail_start, tail)
        try:
            metadata = pq.read_metadata(sparse)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid, ArrowIOError
            raise CorruptRecordError(f"{file.path}: unreadable Parquet footer: {exc}") from None
        footer = _Footer(metadata, tail_start, tail)
        with self._lock:
            self._footers[file.path] = footer
            while len(self._footers) > _MAX_FOOTERS:
                self._footers.popitem(last=False)
        return footer

    def _get(self, file: RemoteFile, start: int, end: int) -> bytes:
        self.gets += 1
        data = self._store.get_range(file.path, start, end)
        if len(data) != end - start:
            raise TierUnavailable(
                f"{file.path}: the store returned {len(data)} bytes for {start}..{end}; the "
                f"object is not the {file.size} bytes the manifest lists"
            )
        return data

    def _fetch(
        self, file: RemoteFile, group: int, manifest: QueueManifest, topic_id: int
    ) -> list[bytes]:
        table = self._table(file, group, manifest, None)
        return table_to_records(table, topic_id, manifest.queue)

    def _table(
        self,
        file: RemoteFile,
        group: int,
        manifest: QueueManifest,
        columns: list[str] | None,
    ) -> Any:
        """A row group of a file (only `columns`, or all), fetched with one ranged GET of
        its span (and the footer, once per file)."""
        footer = self._footer(file)
        meta = footer.metadata
        if group >= meta.num_row_groups:
            raise CorruptRecordError(f"{file.path} has no row group {group}")
        rg = meta.row_group(group)
        starts, ends = [], []
        for c in range(rg.num_columns):
            col = rg.column(c)
            first = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                first = min(first, col.dictionary_page_offset)
            starts.append(first)
            ends.append(first + col.total_compressed_size)
        lo, hi = min(starts), max(ends)
        sparse = _SparseFile(self._store, file.path, file.size)
        sparse.add(footer.tail_start, footer.tail)
        sparse.add(lo, self._get(file, lo, hi))
        try:
            parquet = pq.ParquetFile(
                sparse, metadata=meta, page_checksum_verification=True, pre_buffer=False
            )
            check_file_metadata(parquet.schema_arrow.metadata, manifest.topic, manifest.queue)
            return parquet.read_row_group(group, columns=columns)
        except (OSError, ValueError) as exc:  # a page checksum fails, a page undecodable
            raise CorruptRecordError(f"{file.path}: row group {group}: {exc}") from None


def _end_of(record: bytes) -> int:
    """One past the last offset of a stored record (header: count at 20, base at 24)."""
    return int.from_bytes(record[24:32], "little") + int.from_bytes(record[20:24], "little")
