"""Compacting one queue: keep the latest message of every key, write the next generation
of the queue's compacted log.

A run has three steps. `MessageStore.plan_compaction` (on the store's owner thread)
snapshots what to read: the current compacted log and the commit-log index entries of the
cleanable range, the not-yet-compacted ("dirty") offsets from the compacted log's end up
to the first batch younger than `min.compaction.lag.ms` or not yet flushed.
`run_compaction` (any thread or process, the job is picklable: it only reads immutable
records and writes a new file) does the work in two passes, as Kafka's cleaner does:

1. Map every key of the dirty range to its latest offset there (up to `max_keys` keys; a
   larger range is compacted in part, the rest at the next run).
2. Copy, in offset order, every message still wanted: a message of the old compacted log
   unless the map holds a newer offset for its key; a message of the dirty range if the
   map points at it. A tombstone (null value) that would be kept goes once
   `delete.retention.ms` has passed since compaction first reached it (the record's
   `cleaned_ms`). Messages without a key (written before the topic became compact) are
   dropped. Survivors are packed into version-2 batches that keep each message's offset.

`MessageStore.install_compaction` then switches the queue to the new generation in one
metadata transaction. Nothing is ever served from a file that is not whole (see
`compacted_log.py`), and a crash anywhere leaves the previous generation in place.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from tidemq.core.batch import (
    MessageRecord,
    binary_values,
    columns_to_records,
    decode_columns,
    encode_batch,
    message_offsets,
    parse_envelope,
    tag_summary_for,
)
from tidemq.core.errors import StorageFailure
from tidemq.core.message import with_append_time
from tidemq.core.record import RecordFlags, encode_header, parse_header
from tidemq.store.compacted_log import CompactedLogWriter, CompactedRecord, CompactedSnapshot
from tidemq.store.files import FileHandle, FileSystem
from tidemq.store.format.compacted import KEY_DTYPE, key_hash
from tidemq.store.segmented_log import segment_name

__all__ = [
    "CompactionJob",
    "CompactionResult",
    "DirtyEntry",
    "SegmentReader",
    "record_keys",
    "run_compaction",
]

#: Messages and payload bytes per batch compaction writes: small enough that a key
#: lookup, which reads and decodes the record holding the key, stays cheap (a 1 MiB
#: record made `get` about twice as slow), large enough for reads to stream.
_OUT_MESSAGES: Final = 1024
_OUT_BYTES: Final = 64 << 10
#: Widest span of message timestamps one batch can hold (the batch format's limit).
_TS_SPAN_MAX: Final = (1 << 31) - 1
#: Widest span of store times in one compacted record: a record has one store time (the
#: newest of its messages'), so time retention (compact,delete) and offsets-for-time on
#: compacted data are exact to this much.
STORE_TIME_SPAN_MS: Final = 60_000


class SegmentReader:
    """Reads commit-log records with file handles of its own: the log's handle cache may
    close a handle at any time on the owner thread, and a descriptor closed (and reused)
    under a read on another thread would read another file. It knows the segments from
    a snapshot of their starts (picklable: a run may go to another process); segments
    under a job are pinned, so none of them is deleted while it runs."""

    def __init__(self, fs: FileSystem, directory: Path, starts: list[int]) -> None:
        self._fs = fs
        self._dir = directory
        self._starts = starts
        self._handles: dict[int, FileHandle] = {}

    def __getstate__(self) -> tuple[FileSystem, Path, list[int]]:
        return self._fs, self._dir, self._starts

    def __setstate__(self, state: tuple[FileSystem, Path, list[int]]) -> None:
        self._fs, self._dir, self._starts = state
        self._handles = {}

    def read(self, position: int, size: int) -> bytes:
        start = self._starts[bisect.bisect_right(self._starts, position) - 1]
        handle = self._handles.get(start)
        if handle is None:
            handle = self._handles[start] = self._fs.open(self._dir / segment_name(start))
        data = handle.pread(position - start, size)
        if len(data) != size:
            raise StorageFailure(f"short read at log position {position} during compaction")
        return data

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


class DirtyEntry(NamedTuple):
    """A commit-log index entry of the range to compact (a row of `CompactionJob.dirty`)."""

    log_position: int
    size: int
    messages: int
    base_offset: int
    store_time_ms: int
    tag_summary: int


@dataclass(frozen=True, slots=True)
class CompactionJob:
    topic: str
    topic_id: int
    queue_id: int
    #: The queue's first offset (retention of a compact,delete topic may have raised it).
    start: int
    old: CompactedSnapshot | None
    #: Commit-log index entries of the dirty range, in offset order (`ENTRY_DTYPE` rows:
    #: an array, not objects, so that planning costs the loop little).
    dirty: npt.NDArray[np.void]
    now_ms: int
    delete_retention_ms: int
    directory: Path
    generation: int
    max_keys: int
    fs: FileSystem
    log: SegmentReader


@dataclass(slots=True)
class CompactionResult:
    job: CompactionJob
    path: Path
    #: The new compacted log covers offsets below this.
    end: int
    bytes_in: int = 0
    bytes_out: int = 0
    messages_in: int = 0
    messages_out: int = 0
    keyless_dropped: int = 0
    tombstones_dropped: int = 0


@dataclass(slots=True)
class _Source:
    """One record read for compaction: its messages with their offsets."""

    offsets: list[int]
    messages: list[MessageRecord]
    store_time_ms: int
    #: When compaction first reached this record (now for the dirty range).
    cleaned_ms: int
    dirty: bool
    size: int


@dataclass(slots=True)
class _Group:
    offsets: list[int] = field(default_factory=list)
    messages: list[MessageRecord] = field(default_factory=list)
    store_time_ms: int = 0
    bytes: int = 0
    #: cleaned_ms of the tombstones in the group (one value per group), None: none yet.
    tombstone_ms: int | None = None
    cleaned_ms: int = 0
    min_ts: int = 0
    max_ts: int = 0
    first_store_ms: int = 0


def _decode(record: bytes, what: str) -> tuple[list[int], list[MessageRecord]]:
    header = parse_header(record)
    if header.size != len(record):
        raise StorageFailure(f"compaction read a damaged record ({what})")
    columns = with_append_time(header, decode_columns(memoryview(record)[header.payload_start :]))
    return message_offsets(columns, header.base_offset).tolist(), columns_to_records(columns)


def _sources(job: CompactionJob, end: int) -> Iterator[_Source]:
    """Every record to compact, in offset order: the old compacted log, then the dirty
    range up to `end`."""
    if job.old is not None:
        # A handle of its own, for the reason SegmentReader has.
        handle = job.fs.open(job.old.path)
        try:
            for e in job.old.entries_from(job.start):
                record = handle.pread(int(e["position"]), int(e["size"]))
                offsets, messages = _decode(record, f"{job.topic}/{job.queue_id} compacted log")
                yield _Source(
                    offsets,
                    messages,
                    int(e["store_time_ms"]),
                    int(e["cleaned_ms"]),
                    False,
                    len(record),
                )
        finally:
            handle.close()
    for entry in _dirty(job):
        if entry.base_offset >= end:
            break
        record = job.log.read(entry.log_position, entry.size)
        offsets, messages = _decode(record, f"{job.topic}/{job.queue_id} commit log")
        yield _Source(offsets, messages, entry.store_time_ms, job.now_ms, True, len(record))


def _key_map(job: CompactionJob) -> tuple[dict[bytes, int], int]:
    """Pass 1: the latest offset of each key of the dirty range, and where the range
    compacted this time ends (earlier than the dirty range's end past `max_keys` keys)."""
    latest: dict[bytes, int] = {}
    entries = _dirty(job)
    end = entries[-1].base_offset + entries[-1].messages if entries else _old_end(job)
    for entry in entries:
        if len(latest) >= job.max_keys:
            end = entry.base_offset
            break
        for i, key in enumerate(record_keys(job.log.read(entry.log_position, entry.size))):
            if key is not None:
                latest[key] = entry.base_offset + i
    return latest, end


def record_keys(record: bytes) -> list[bytes | None]:
    """The key of each message of a stored record (None: no key)."""
    header = parse_header(record)
    return binary_values(decode_columns(memoryview(record)[header.payload_start :]).key)


def _dirty(job: CompactionJob) -> list[DirtyEntry]:
    return [DirtyEntry(*row) for row in job.dirty.tolist()]


def _old_end(job: CompactionJob) -> int:
    return job.start if job.old is None else max(job.old.end, job.start)


def run_compaction(job: CompactionJob) -> CompactionResult:
    """Write the next generation (the file only: `install_compaction` switches to it)."""
    latest, end = _key_map(job)
    writer = CompactedLogWriter(job.fs, job.directory, job.generation)
    result = CompactionResult(job, writer.path, max(end, _old_end(job)))
    keys: list[tuple[int, int]] = []
    group = _Group()
    try:
        for source in _sources(job, end):
            result.bytes_in += source.size
            result.messages_in += len(source.messages)
            for offset, message in zip(source.offsets, source.messages, strict=True):
                if not _keep(job, result, latest, source, offset=offset, message=message):
                    continue
                tombstone_ms = source.cleaned_ms if message.value is None else None
                if _full(group, message, source, tombstone_ms):
                    _flush(job, writer, result, group)
                    group = _Group()
                _add(group, offset, message, source, tombstone_ms)
                keys.append((key_hash(message.key or b""), offset))
        _flush(job, writer, result, group)
        ordered = np.array(sorted(keys), dtype=KEY_DTYPE)
        writer.finish(result.end, ordered)
    except BaseException:
        writer.abort()
        raise
    finally:
        job.log.close()
    return result


def _keep(
    job: CompactionJob,
    result: CompactionResult,
    latest: dict[bytes, int],
    source: _Source,
    *,
    offset: int,
    message: MessageRecord,
) -> bool:
    if message.key is None:
        result.keyless_dropped += 1
        return False
    newest = latest.get(message.key)
    wanted = newest == offset if source.dirty else newest is None
    if (
        wanted
        and message.value is None
        and source.cleaned_ms + job.delete_retention_ms <= job.now_ms
    ):
        result.tombstones_dropped += 1
        return False
    return wanted


def _full(group: _Group, message: MessageRecord, source: _Source, tombstone_ms: int | None) -> bool:
    if not group.messages:
        return False
    size = len(message.value or b"") + len(message.key or b"")
    ts = message.timestamp_ms
    return (
        len(group.messages) >= _OUT_MESSAGES
        or group.bytes + size > _OUT_BYTES
        or max(group.max_ts, ts) - min(group.min_ts, ts) > _TS_SPAN_MAX
        or source.store_time_ms - group.first_store_ms > STORE_TIME_SPAN_MS
        # One cleaned time per record: tombstones reached at different times stay apart.
        or (tombstone_ms is not None and group.tombstone_ms not in (None, tombstone_ms))
    )


def _add(
    group: _Group, offset: int, message: MessageRecord, source: _Source, tombstone_ms: int | None
) -> None:
    if not group.messages:
        group.min_ts = group.max_ts = message.timestamp_ms
    group.offsets.append(offset)
    group.messages.append(message)
    group.bytes += len(message.value or b"") + len(message.key or b"")
    if not group.first_store_ms:
        group.first_store_ms = source.store_time_ms
    group.store_time_ms = max(group.store_time_ms, source.store_time_ms)
    group.cleaned_ms = max(group.cleaned_ms, source.cleaned_ms)
    group.min_ts = min(group.min_ts, message.timestamp_ms)
    group.max_ts = max(group.max_ts, message.timestamp_ms)
    if tombstone_ms is not None:
        group.tombstone_ms = tombstone_ms


def _flush(
    job: CompactionJob, writer: CompactedLogWriter, result: CompactionResult, group: _Group
) -> None:
    if not group.messages:
        return
    base = group.offsets[0]
    payload = encode_batch(group.messages, offset_deltas=[o - base for o in group.offsets])
    env = parse_envelope(payload, verify_crc=False)
    header = encode_header(
        payload_size=len(payload),
        properties=b"",
        flags=RecordFlags.COMPACTED,
        topic_id=job.topic_id,
        queue_id=job.queue_id,
        count=len(group.messages),
        base_offset=base,
        store_time_ms=group.store_time_ms,
        producer_id=-1,
        base_sequence=-1,
        producer_epoch=-1,
        payload_crc=env.crc,
    )
    record = header + payload
    tombstones = sum(1 for m in group.messages if m.value is None)
    writer.add(
        CompactedRecord(
            record=record,
            count=len(group.messages),
            base_offset=base,
            end_offset=group.offsets[-1] + 1,
            store_time_ms=group.store_time_ms,
            tag_summary=tag_summary_for(m.tag for m in group.messages),
            cleaned_ms=group.tombstone_ms if group.tombstone_ms is not None else group.cleaned_ms,
            tombstones=tombstones,
        )
    )
    result.bytes_out += len(record)
    result.messages_out += len(group.messages)
