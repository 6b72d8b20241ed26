"""The commit log: every batch of every queue, appended as one record, in arrival order.

It knows records, positions and durability; it knows no queues. The flushed position is
the durable tail: every byte before it survived an fdatasync. An fsync failure fences the
log (fail-stop): durability is unknowable after it, so every later append and flush raises
StorageFailure until the store is reopened and recovered.

Single writer: the store's owner serialises every call.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidemq.core.clock import Clock
from tidemq.core.errors import CorruptRecordError, DiskFull, StorageFailure
from tidemq.core.record import HEADER, RecordHeader, encode_header, parse_header
from tidemq.core.record import verify_payload as _verify_payload
from tidemq.store.segmented_log import SegmentedLog

__all__ = ["AppendedRecord", "CommitLog", "ScannedRecord"]

#: Recovery reads the log in chunks of this size.
_SCAN_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class AppendedRecord:
    position: int
    size: int
    store_time_ms: int


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    position: int
    header: RecordHeader
    tag_summary: int
    #: The whole record, checked (a view of the scan's buffer: use it before the next).
    record: memoryview


class CommitLog:
    def __init__(self, segments: SegmentedLog, *, clock: Clock) -> None:
        self._segments = segments
        self._clock = clock
        self._flushed = segments.end_position
        self._last_store_time_ms = 0
        self._failure: str | None = None

    @property
    def end_position(self) -> int:
        return self._segments.end_position

    @property
    def flushed_position(self) -> int:
        return self._flushed

    @property
    def start_position(self) -> int:
        return self._segments.start_position

    @property
    def segments(self) -> SegmentedLog:
        return self._segments

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StorageFailure(f"commit log fenced after an earlier failure: {self._failure}")

    @property
    def last_store_time_ms(self) -> int:
        return self._last_store_time_ms

    def note_store_time(self, store_time_ms: int) -> None:
        """Recovery tells the log the newest store time seen, to keep store times monotone."""
        self._last_store_time_ms = max(self._last_store_time_ms, store_time_ms)

    def append(
        self,
        payload: bytes | memoryview,
        properties: bytes,
        *,
        flags: int,
        topic_id: int,
        queue_id: int,
        count: int,
        base_offset: int,
        producer_id: int,
        base_sequence: int,
        producer_epoch: int,
        payload_crc: int,
    ) -> AppendedRecord:
        self._check_usable()
        # Store times never go backwards within a log, even if the wall clock does, so
        # that offset-for-time lookups can binary-search the queue index.
        store_time = max(self._last_store_time_ms, self._clock.now_ms())
        header = encode_header(
            payload_size=len(payload),
            properties=properties,
            flags=flags,
            topic_id=topic_id,
            queue_id=queue_id,
            count=count,
            base_offset=base_offset,
            store_time_ms=store_time,
            producer_id=producer_id,
            base_sequence=base_sequence,
            producer_epoch=producer_epoch,
            payload_crc=payload_crc,
        )
        size = HEADER.size + len(properties) + len(payload)
        position = self._write((header, properties, payload), size)
        self._last_store_time_ms = store_time
        return AppendedRecord(position, size, store_time)

    def append_copy(self, record: bytes | memoryview, header: RecordHeader) -> AppendedRecord:
        """Append a whole record copied from another member's log (replication): its bytes
        unchanged, its store time included, so both logs hold the same record at the same
        position. The caller checked it (`parse_header`, `verify_payload`)."""
        self._check_usable()
        if header.store_time_ms < self._last_store_time_ms:
            # The leader's store times never decrease; an older one means the copy does
            # not continue this log.
            raise CorruptRecordError(
                f"copied record's store time {header.store_time_ms} is before this log's "
                f"last ({self._last_store_time_ms})"
            )
        position = self._write((record,), header.size)
        self._last_store_time_ms = header.store_time_ms
        return AppendedRecord(position, header.size, header.store_time_ms)

    def _write(self, buffers: tuple[bytes | memoryview, ...], size: int) -> int:
        try:
            return self._segments.append(buffers, size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left for a {size}-byte record") from None
            self._failure = f"write failed: {exc}"
            raise StorageFailure(f"commit log write failed: {exc}") from None

    def begin_flush(self) -> tuple[int, Callable[[], None]]:
        """Split flush, for an owner that runs the fdatasync on another thread while it
        keeps appending: returns (target position, the sync to run). Then call
        `complete_flush(target)` on success or `fail_flush(error)` on OSError.

        Segments sealed since the last flush were synced when they rolled, so syncing the
        active segment makes everything up to the target durable.
        """
        self._check_usable()
        return self._segments.end_position, self._segments.active_handle().sync

    def complete_flush(self, target: int) -> None:
        # A fenced log stays where it was: a sync that "succeeded" after another failed
        # proves nothing (the kernel may have dropped the pages the failure was about).
        if self._failure is None:
            self._flushed = max(self._flushed, target)

    def fail_flush(self, error: OSError) -> StorageFailure:
        """Fence the log after a failed fdatasync; returns the error to report."""
        self._failure = f"fdatasync failed: {error}"
        return StorageFailure(f"commit log fdatasync failed: {error}")

    def flush(self) -> int:
        """fdatasync everything appended so far; return the flushed position."""
        self._check_usable()
        end = self._segments.end_position
        if end == self._flushed:
            return end
        try:
            self._segments.sync()
        except OSError as exc:
            # Never retry an fsync and assume success: the kernel may have dropped the
            # dirty pages already (the fsyncgate lesson). Fence instead.
            self._failure = f"fdatasync failed: {exc}"
            raise StorageFailure(f"commit log fdatasync failed: {exc}") from None
        self._flushed = end
        return end

    def read(self, position: int, size: int) -> bytes:
        return self._segments.read(position, size)

    def scan_headers(self, from_position: int) -> Iterator[tuple[int, RecordHeader]]:
        """(position, header) of every record from `from_position` to the end of the log,
        with one small read per record (header and properties, checked by their CRC) and
        no payload read: for the broker's services after recovery has verified the log
        (a second full scan of 1 GiB took about a second and a half)."""
        position = max(from_position, self.start_position)
        end = self.end_position
        while position < end:
            head = self._segments.read(position, HEADER.size)
            props_size = HEADER.unpack_from(head)[13]
            if props_size:
                head = self._segments.read(position, HEADER.size + props_size)
            header = parse_header(head)
            yield position, header
            position += header.size

    # ------------------------------------------------------------------ recovery

    def scan(self, from_position: int) -> Iterator[ScannedRecord]:
        """Yield every valid record from `from_position` to the end of the valid log.

        The last segment may end in a torn or zero-filled tail: the scan stops there and
        the end of the last record yielded (or `from_position`) is the valid end. Any
        earlier segment must be whole; a bad record there is corruption of acknowledged
        data and raises CorruptRecordError.
        """
        starts = self._segments.segment_starts()
        from_position = max(from_position, starts[0])
        for i, start in enumerate(starts):
            end = self._segments.segment_end(start)
            if end <= from_position:
                continue
            last = i == len(starts) - 1
            file_end = start + self._segments.segment_file_size(start)
            position = max(from_position, start)
            yield from self._scan_segment(start, position, file_end, last=last)

    def _scan_segment(
        self, start: int, position: int, file_end: int, *, last: bool
    ) -> Iterator[ScannedRecord]:
        buf = b""
        buf_start = position
        while position < file_end:
            # Room for a header and the largest properties block, or up to the file end.
            want = position - buf_start + min(file_end - position, HEADER.size + 0xFFFF)
            if want > len(buf):
                buf = buf[position - buf_start :] + self._segments.read_segment_tail(
                    start, buf_start + len(buf), _SCAN_CHUNK_BYTES
                )
                buf_start = position
            header = self._parse_at(buf, position - buf_start, file_end - position, last)
            if header is None:
                return
            rel = position - buf_start
            if rel + header.size > len(buf):
                buf = buf[rel:] + self._segments.read_segment_tail(
                    start, buf_start + len(buf), max(_SCAN_CHUNK_BYTES, header.size)
                )
                buf_start = position
                rel = 0
            record = memoryview(buf)[rel : rel + header.size]
            if len(record) < header.size:
                return self._bad(position, last, "record runs past the end of the file")
            try:
                env = _verify_payload(header, record)
            except CorruptRecordError as exc:
                return self._bad(position, last, str(exc))
            yield ScannedRecord(position, header, env.tag_summary, record)
            position += header.size

    def _parse_at(self, buf: bytes, rel: int, remaining: int, last: bool) -> RecordHeader | None:
        if remaining < HEADER.size or len(buf) - rel < 4:
            return self._bad(rel, last, "truncated header")
        if buf[rel : rel + 4] == b"\0\0\0\0":
            if last:
                return None  # a zero-filled tail is the end of the log
            raise CorruptRecordError("zero-length record inside a sealed segment")
        try:
            header = parse_header(buf, rel)
        except CorruptRecordError as exc:
            return self._bad(rel, last, str(exc))
        if header.size > remaining:
            return self._bad(rel, last, "record runs past the end of the segment")
        return header

    @staticmethod
    def _bad(position: int, last: bool, why: str) -> None:
        if last:
            return  # torn tail: the log ends before it
        raise CorruptRecordError(f"corrupt record in a sealed segment near {position}: {why}")

    def truncate_to(self, position: int) -> None:
        """Drop a torn tail found by scan (the last segment only); the log up to `position`
        is durable when this returns."""
        if position < self._segments.end_position:
            self._segments.truncate(position)  # syncs
        else:
            # After kill -9 the tail may still be only in the page cache: a power loss now
            # would take it, yet it is about to be called flushed (and checkpointed).
            self._segments.sync()
        self._flushed = position

    def truncate_from(self, position: int, *, kept_store_time_ms: int) -> None:
        """Drop every record at or past `position` (a record boundary), durably.
        `kept_store_time_ms`: the store time of the newest record kept. Store times go on
        from it, not from the records cut: a cut suffix may be newer than the records
        that replace it (written by a deposed leader after the next one began, or by a
        clock running ahead), and the copies of those must not be refused as older."""
        self._check_usable()
        self._segments.truncate_from(position)
        self._flushed = min(self._flushed, position)
        self._last_store_time_ms = kept_store_time_ms

    def close(self) -> None:
        self._segments.close()
