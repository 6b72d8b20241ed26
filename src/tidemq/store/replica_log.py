"""The store's side of log replication: the leader reads whole records by log position,
a follower appends them at the same positions and derives its indexes from them.

Replication copies the commit log byte for byte (RocketMQ's HA shape, docs/design/
replication.md): every record type travels the same way (data, timer schedules,
transaction halves and decisions, pop operations, retries), so a follower that becomes
leader finds in its own log everything the services rebuild their state from. A follower
never re-encodes a record: same bytes, same position, same store time, so a position
means the same record on every member, and "how far is this follower" is one number.

What the log does not carry, the topics themselves (ids, names, queues, config) and the
producer-id counter, a follower mirrors from its leader (`mirror_topics`,
`note_producer_ids`) before it appends records that need them: a record of a topic id
this store has never heard of stops the append (`TopicsBehind`), and the follower
mirrors the leader's topics and goes on. Topic ids are never reused, so an id at or below
the highest one mirrored that is not live was deleted: its records are appended to the
log (positions must match) and indexed nowhere, as recovery does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tidemq.core.errors import CorruptRecordError, OffsetOutOfRange, TopicNotFound
from tidemq.core.record import HEADER, RecordHeader, parse_header, verify_payload
from tidemq.store.checkpoint import write_checkpoint
from tidemq.store.compacted_queues import message_keys
from tidemq.store.format.checkpoint import Checkpoint
from tidemq.store.metadata import CleanupPolicy, TopicInfo
from tidemq.store.producer_state import NO_PRODUCER, ProducerStamp

if TYPE_CHECKING:
    from tidemq.core.batch import Envelope
    from tidemq.store.message_store import MessageStore
    from tidemq.store.queue_index import QueueIndex

__all__ = ["LogChunk", "LogDiverged", "ReplicaView", "TopicsBehind"]

_SIZE: Final = struct.Struct("<I")


class LogDiverged(CorruptRecordError):
    """The records offered do not continue this log where they claim to (another
    position, or not a record boundary): the follower's log and the leader's differ from
    some point on, and the follower must truncate (by the epoch history) before it
    fetches again."""


class TopicsBehind(TopicNotFound):
    """A copied record needs topic metadata this store has not mirrored yet (a topic id
    above every id mirrored, or a queue added since): mirror the leader's topics, then
    append again from the log's end."""

    def __init__(self, message: str, *, topic_id: int) -> None:
        super().__init__(message)
        self.topic_id = topic_id


@dataclass(frozen=True, slots=True)
class LogChunk:
    #: Log position of the first record.
    position: int
    #: Whole records, back to back (empty: nothing past `position` yet).
    data: bytes
    records: int

    @property
    def end(self) -> int:
        return self.position + len(self.data)


class ReplicaView:
    """Replication's reads and appends on one store (`MessageStore.replica`)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store

    # ------------------------------------------------------------------ leader side

    def read_chunk(self, position: int, max_bytes: int, *, limit: int) -> LogChunk:
        """Whole records from `position` (a record boundary of this log) up to `limit` (at
        most the log's end), at most `max_bytes` of them, but always the first record when
        one starts before `limit`, however large: a follower must be able to progress.
        Records never span segments, so one read within a segment serves a chunk."""
        log = self._store.log
        limit = min(limit, log.end_position)
        if position < log.start_position:
            raise OffsetOutOfRange(
                f"log position {position} was deleted by retention; the log starts at "
                f"{log.start_position}"
            )
        if position > log.end_position:
            raise LogDiverged(
                f"log position {position} is past this log's end ({log.end_position})"
            )
        if position >= limit:
            return LogChunk(position, b"", 0)
        segments = log.segments
        stop = min(limit, segments.segment_end(segments.locate(position)))
        first = _SIZE.unpack(segments.read(position, _SIZE.size))[0]
        if not HEADER.size <= first <= stop - position:
            raise LogDiverged(f"log position {position} is not a record boundary of this log")
        data = segments.read(position, max(first, min(max_bytes, stop - position)))
        try:
            parse_header(data)  # a boundary: a whole header whose CRC holds
        except CorruptRecordError:
            raise LogDiverged(
                f"log position {position} is not a record boundary of this log"
            ) from None
        end, records = 0, 0
        while end + _SIZE.size <= len(data):
            size = _SIZE.unpack_from(data, end)[0]
            if size < HEADER.size or end + size > len(data):
                break
            end += size
            records += 1
        return LogChunk(position, data[:end], records)

    # ------------------------------------------------------------------ follower side

    def append_chunk(self, chunk: LogChunk) -> int:
        """Append a leader's records at the positions they have there; returns this log's
        new end. Every record is checked first (header and payload CRCs, envelope, a
        topic and queue mirrored here, offsets continuing the queue): when one fails,
        nothing of the chunk is written and the error says why (`LogDiverged`,
        `TopicsBehind`, `CorruptRecordError`). A write that fails (`DiskFull`) leaves the
        records before it appended. Durable only once flushed, as any append."""
        store = self._store
        if chunk.position != store.log.end_position:
            raise LogDiverged(
                f"records at log position {chunk.position} do not continue this log, which "
                f"ends at {store.log.end_position}"
            )
        for info, header, record, env in self._checked(chunk):
            self._append_one(info, header, record, env)
        return store.log.end_position

    def _checked(
        self, chunk: LogChunk
    ) -> list[tuple[TopicInfo | None, RecordHeader, memoryview, Envelope]]:
        store = self._store
        view = memoryview(chunk.data)
        topics = store.topics_by_id()
        known = store.metadata.max_topic_id()
        indexes = store.queue_indexes()
        next_offsets: dict[tuple[int, int], int] = {}
        out: list[tuple[TopicInfo | None, RecordHeader, memoryview, Envelope]] = []
        at = 0
        while at < len(view):
            where = chunk.position + at
            header = parse_header(view, at)
            if at + header.size > len(view):
                raise CorruptRecordError(f"chunk ends inside the record at {where}")
            record = view[at : at + header.size]
            env = verify_payload(header, record)
            info = topics.get(header.topic_id)
            key = (header.topic_id, header.queue_id)
            if info is not None or header.topic_id > known:
                index = indexes.get(key)
                if index is None:
                    raise TopicsBehind(
                        f"record at log position {where} is of topic id {header.topic_id} "
                        f"queue {header.queue_id}, not mirrored here yet (highest topic id "
                        f"mirrored: {known})",
                        topic_id=header.topic_id,
                    )
                expected = next_offsets.get(key, index.next_offset)
                if header.base_offset != expected and not (
                    key not in next_offsets and _starts_queue(store, index, header)
                ):
                    raise LogDiverged(
                        f"record at log position {where} has offset {header.base_offset} "
                        f"for topic id {header.topic_id} queue {header.queue_id}, which "
                        f"continues at {expected} here"
                    )
                next_offsets[key] = header.base_offset + header.count
            out.append((info, header, record, env))
            at += header.size
        return out

    def _append_one(
        self, info: TopicInfo | None, header: RecordHeader, record: memoryview, env: Envelope
    ) -> None:
        store = self._store
        store.watermark.reserve(header.size)
        if info is None:  # a deleted topic: in the log for the positions, indexed nowhere
            store.log.append_copy(record, header)
            return
        key = (header.topic_id, header.queue_id)
        index = store.queue_indexes()[key]
        if _starts_queue(store, index, header):
            index.reset(header.base_offset)
        payload = record[header.payload_start :]
        keys = None
        if info.cleanup_policy is not CleanupPolicy.DELETE and key in store.dirty_keys:
            keys = message_keys(payload, info.name)
        rec = store.log.append_copy(record, header)
        store.note_appended(info, header.queue_id, index, payload, env, rec, keys)
        if header.producer_id != NO_PRODUCER:
            stamp = ProducerStamp(header.producer_id, header.producer_epoch, header.base_sequence)
            store.note_producer_batch(
                (*key, header.producer_id), stamp, header.count, header.base_offset,
                rec.position + rec.size,
            )  # fmt: skip

    def truncate(self, position: int) -> None:
        """Drop every record at or past `position` (a record boundary): the suffix a
        deposed leader, or a follower of one, wrote under an epoch the group has moved
        past. Replication never cuts below what the group committed, so nothing
        acknowledged (or compacted, or offloaded: both stop at the committed position)
        goes.

        Crash-safe in this order: a checkpoint at `position` is written, then the indexes
        are cut, then the log: a crash before the log is cut recovers it whole (replaying
        the suffix into the indexes again) and the truncation is simply done again; once
        the log is cut, recovery finds it ending at the checkpoint
        (tests/simulation/test_truncation_crash_sim.py crashes at every write)."""
        store = self._store
        log = store.log
        if position == log.end_position:
            return
        if not log.start_position <= position < log.end_position:
            raise LogDiverged(
                f"cannot cut at log position {position}: the log spans "
                f"[{log.start_position}, {log.end_position})"
            )
        store.checkpoint()  # pending index entries into their files: the cuts read them
        queues = store.queue_indexes()
        # The newest store time kept (records of deleted topics, indexed nowhere, aside:
        # then a little older, which only loosens the check of the next copied record).
        # The suffix's times go with it, also from the checkpoint recovery starts from.
        kept_ms = max((index.store_time_before(position) for index in queues.values()), default=0)
        # From here until the log is cut, recovery replays the suffix from `position`.
        write_checkpoint(store.fs, store.config.data_dir, Checkpoint(position, position, kept_ms))
        for index in queues.values():
            index.cut_from_position(position)
        store.key_index.cut_from_position(position)
        store.metadata.set_queue_index_ends({k: i.next_offset for k, i in queues.items()})
        log.truncate_from(position, kept_store_time_ms=kept_ms)
        store.producer_states.cut_from_position(position)
        store.dirty_keys.clear()
        store.mark_all_queues_dirty()
        store.checkpoint()

    # ------------------------------------------------------------------ metadata

    def mirror_topics(self, topics: list[TopicInfo], max_topic_id: int) -> None:
        """Make this store's topics the leader's: create the ones missing (under the
        leader's ids), change the ones that differ, delete the ones the leader has not
        got. `max_topic_id` is the leader's highest id ever given (deleted ones count)."""
        store = self._store
        wanted = {t.id: t for t in topics}
        for info in store.topics():
            if info.id not in wanted:
                store.delete_topic(info.name)
        have = store.topics_by_id()
        new = [t for t in topics if t.id not in have]
        if new:
            store.adopt_topics(new)
        for info in topics:
            old = have.get(info.id)
            if old is not None and old != info:
                store.put_topic(info)
        store.metadata.note_topic_id(max_topic_id)


def _starts_queue(store: MessageStore, index: QueueIndex, header: RecordHeader) -> bool:
    """A record that starts its queue in this log below where the queue was set to
    continue: the log was started over at the leader's log start (`start_over.py`),
    whose queue offsets come from the leader's indexes, and those may lack entries of
    records past the log start that the leader's retention already dropped from its
    queue (below its min offset; the segment holding them stays while any queue needs
    it). Such records are the queue's first here, and the queue starts at them."""
    return (
        index.last_position < 0
        and header.base_offset < index.next_offset
        and store.log.start_position > 0
    )
