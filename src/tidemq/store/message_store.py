"""The storage engine's facade: the only API the layers above the store use.

One commit log holds every batch of every queue; per-queue indexes point into it. The
owner (the broker's store gateway, a test, a benchmark) serialises every call: the store
is single-threaded by design, with no locks on the write path.

Durability contract:

* `append` writes the record and returns its offsets. In `sync` flush mode the record is
  acknowledged only after `flush()` has returned a position at or past `end_position`;
  one flush covers every record appended before it (group commit).
* In `sync` mode reads see only flushed records, so no consumer ever sees a message that a
  power loss could take back. In `async` mode they see every appended record.
* `checkpoint()` writes index entries and producer state, then the checkpoint file. After a
  crash, `MessageStore.open` truncates the torn tail of the log and re-derives everything
  past the checkpoint (see `recovery.py`).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

import numpy as np

from tidemq.core import limits
from tidemq.core.batch import (
    Envelope,
    check_tags,
    decode_columns,
    first_index_at,
    message_offsets,
    parse_envelope,
)
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import (
    BatchTooLarge,
    ConfigError,
    DiskFull,
    FencedProducer,
    InvalidBatch,
    QueueMoved,
    QueueNotFound,
    StorageFailure,
    StoreClosed,
    TopicNotFound,
)
from tidemq.core.message import with_append_time
from tidemq.core.record import RecordFlags, parse_header
from tidemq.core.static_chain import QueueChain
from tidemq.store import compactor
from tidemq.store.checkpoint import write_checkpoint
from tidemq.store.commit_log import AppendedRecord, CommitLog
from tidemq.store.compacted_log import CompactedLog
from tidemq.store.compacted_queues import CompactedQueues, FoundMessage, message_keys
from tidemq.store.compaction import CompactionJob, CompactionResult
from tidemq.store.compactor import CompactionDue
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.files import FileSystem, OsFileSystem
from tidemq.store.format.checkpoint import Checkpoint
from tidemq.store.format.index_entry import ENTRY
from tidemq.store.key_index import KeyIndex, batch_keys, indexes_topic
from tidemq.store.key_lookup import KeyMatches, find_by_key
from tidemq.store.metadata import CleanupPolicy, MessageType, Metadata, TopicInfo
from tidemq.store.offload import OffloadView
from tidemq.store.producer_state import NO_PRODUCER, ProducerStamp, ProducerStates
from tidemq.store.queue_index import IndexFileCache, QueueIndex
from tidemq.store.remote_ranges import RemoteRanges
from tidemq.store.replica_log import ReplicaView
from tidemq.store.static_queues import StaticQueues

__all__ = [
    "AppendResult",
    "DiskWatermark",
    "MessageStore",
    "ReadResult",
    "ReadStatus",
    "StoredBatch",
]

log = logging.getLogger(__name__)

#: Index entries examined per read before giving up on a tag filter that matches nothing.
_READ_SCAN_ENTRIES_MAX = 4096
#: Bytes a commit-log record adds to its payload and properties (its header), rounded up.
_RECORD_OVERHEAD_BYTES = 128
#: Batches `offset_for_time` looks into for the first message at or after a time, past
#: the first batch stored after it (bounded work per lookup).
_TIME_SCAN_BATCHES = 16
#: Kafka's topic config, and the value that makes the broker's append time the messages'.
TIMESTAMP_TYPE_KEY = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskWatermark:
    """Whether one more append would take the disk past `disk_reject_ratio`, for the price
    of a counter per append.

    After each look at the disk (`FileSystem.disk_usage`, statvfs) it knows the headroom:
    the bytes that may still be written before the watermark. It looks again once the
    bytes appended since exceed half of that headroom (so looks come more often as the
    disk nears the mark, one per append at the end), or `disk_check_interval_bytes`, or
    `disk_check_interval_ms` has passed (other files and processes use the disk too). So
    the commit log stops at the watermark instead of running the disk to 100%; what else
    writes (indexes, metadata) has the rest. While full it looks at every append, so
    appends resume as soon as space is freed. It logs once when the disk crosses the
    watermark and once when it is back below, never per refused append."""

    def __init__(self, fs: FileSystem, config: StoreConfig, clock: Clock) -> None:
        self._fs = fs
        self._path = config.data_dir
        self._ratio = config.disk_reject_ratio
        self._interval_bytes = config.disk_check_interval_bytes
        self._interval_ms = config.disk_check_interval_ms
        self._clock = clock
        self._headroom = 0
        self._budget = 0  # bytes that may be appended before the next look
        self._spent = 0
        self._looked_ms = float("-inf")
        self.full = False
        #: Looks at the disk so far (for tests and status).
        self.looks = 0

    def reserve(self, size: int) -> None:
        """Account for an append of `size` bytes; raises DiskFull if it would go past the
        watermark (then nothing is accounted)."""
        now = self._clock.monotonic_ms()
        if (
            self.full
            or self._spent + size > self._budget
            or now - self._looked_ms >= self._interval_ms
        ):
            self._look(now)
            if size > self._headroom:
                self._set_full(True, size)
                raise DiskFull(
                    f"disk above store.disk_reject_ratio {self._ratio:.0%} (a {size}-byte "
                    f"append would pass it; {max(self._headroom, 0)} bytes left below it); "
                    "appends resume when space is freed"
                )
            self._set_full(False, size)
        self._spent += size

    def _look(self, now: float) -> None:
        self._looked_ms = now
        self._spent = 0
        self.looks += 1
        try:
            total, free = self._fs.disk_usage(self._path)
        except OSError:
            # Cannot tell: let the writes find out (they raise DiskFull on ENOSPC).
            self._headroom = self._budget = self._interval_bytes
            return
        keep_free = total - int(total * self._ratio)
        self._headroom = free - keep_free
        self._budget = min(max(self._headroom // 2, 0), self._interval_bytes)

    def _set_full(self, full: bool, size: int) -> None:
        if full == self.full:
            return
        self.full = full
        if full:
            log.warning(
                "disk %s is at store.disk_reject_ratio %.0f%%: appends are refused "
                "(DiskFull) until space is freed",
                self._path,
                self._ratio * 100,
            )
        else:
            log.warning(
                "disk %s is below store.disk_reject_ratio again: appends resume", self._path
            )


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    count: int
    #: The record is durable (in sync mode: may be acknowledged) once the flushed
    #: position reaches this.
    end_position: int
    store_time_ms: int
    #: True when this was a retried batch already stored; nothing new was written.
    duplicate: bool = False


class ReadStatus(StrEnum):
    FOUND = "found"
    NO_NEW_MESSAGE = "no_new_message"
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"
    #: The offset is readable, from the object store only (tiered storage): the broker's
    #: tier reader serves it.
    REMOTE = "remote"


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: int
    count: int
    store_time_ms: int
    #: The whole commit-log record as stored: header, properties, batch payload.
    record: bytes


@dataclass(frozen=True, slots=True)
class ReadResult:
    status: ReadStatus
    batches: list[StoredBatch]
    #: Where the next read should start (past skipped batches too).
    next_offset: int
    min_offset: int
    max_offset: int  # one past the newest readable message


class MessageStore:
    """One broker's data: a commit log, queue indexes, metadata, producer state."""

    def __init__(
        self,
        *,
        config: StoreConfig,
        fs: FileSystem,
        clock: Clock,
        metadata: Metadata,
        log: CommitLog,
        queues: dict[tuple[int, int], QueueIndex],
        producers: ProducerStates,
        index_cache: IndexFileCache,
        indexed_position: int,
        key_index: KeyIndex,
        compacted: dict[tuple[int, int], CompactedLog] | None = None,
    ) -> None:
        """Use `MessageStore.open`; this only assembles recovered parts."""
        self.config = config
        self._fs = fs
        self._clock = clock
        self._meta = metadata
        self._log = log
        self._queues = queues
        self._producers = producers
        #: Producer ids are handed out in order: any id above this one was never issued.
        self._last_producer_id = metadata.last_producer_id()
        self._index_cache = index_cache
        self._indexed_position = indexed_position
        self._topics: dict[str, TopicInfo] = {t.name: t for t in metadata.live_topics()}
        #: Where each message key is, for every topic without key.index=false (key_index.py).
        self.key_index = key_index
        self._key_indexed = {t.id for t in self._topics.values() if indexes_topic(t.name, t.config)}
        #: Compact queues' compacted logs (see compacted_queues.py).
        self.compacted = CompactedQueues(fs, metadata, compacted or {})
        #: Chains of the static queues this broker holds links of.
        self.static = StaticQueues(metadata)
        #: What of each queue lives in the object store (tiered storage).
        self.remote = RemoteRanges(metadata)
        #: Per compact queue, built on its first key lookup: the latest offset of each key
        #: written past its compacted log (kept current by `append`).
        self.dirty_keys: dict[tuple[int, int], dict[bytes, int]] = {}
        self._dirty_queues: set[tuple[int, int]] = set()
        #: Log positions that broker services will scan again on restart (name -> position):
        #: retention keeps the segments from the smallest one on.
        self._log_pins: dict[str, int] = {}
        self._closed = False
        #: In a replica group: the group's committed position, set by the broker's
        #: replication (None: no replication, every flushed record is readable).
        self.commit_limit: int | None = None
        #: Counts changes to the topic table since the store opened (a replica group's
        #: followers mirror the leader's table when it moves).
        self.topics_version = 0
        self._watermark = DiskWatermark(fs, config, clock)
        #: Index entries appended since the last checkpoint (they are written at the next).
        self._unindexed_entries = 0
        now = clock.monotonic_ms()
        self._last_flush_ms = now
        self._last_checkpoint_ms = now

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        metadata_path: Path | None = None,
    ) -> MessageStore:
        """Open (and if needed recover) the store in `config.data_dir`."""
        from tidemq.store.recovery import recover  # noqa: PLC0415 - recovery builds the store

        return recover(
            config,
            fs or OsFileSystem(),
            clock or SystemClock(),
            metadata_path or config.data_dir / "meta.sqlite",
        )

    # ------------------------------------------------------------------ topics

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    def create_topic(
        self,
        name: str,
        queues: int,
        *,
        message_type: MessageType = MessageType.MIXED,
        cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        config: Mapping[str, str] | None = None,
        created_ms: int | None = None,
    ) -> TopicInfo:
        """`created_ms`: the creation time to record (a topic restored from the tier keeps
        its original one); now by default."""
        (info,) = self.create_topics(
            [
                TopicInfo(
                    id=0,
                    name=name,
                    queues=queues,
                    message_type=message_type,
                    cleanup_policy=cleanup_policy,
                    retention_ms=retention_ms,
                    retention_bytes=retention_bytes,
                    config=dict(config or {}),
                    created_ms=self._clock.now_ms() if created_ms is None else created_ms,
                )
            ]
        )
        return info

    def create_topics(self, templates: list[TopicInfo]) -> list[TopicInfo]:
        """Topics from templates (their `id` is ignored; `created_ms` 0: now), in one
        metadata transaction: all are created or none."""
        return self._add_topics(templates, keep_ids=False)

    def adopt_topics(self, infos: list[TopicInfo]) -> list[TopicInfo]:
        """Topics exactly as another member of the replica group has them, ids included."""
        return self._add_topics(infos, keep_ids=True)

    def _add_topics(self, templates: list[TopicInfo], *, keep_ids: bool) -> list[TopicInfo]:
        self._check_open()
        now = self._clock.now_ms()
        infos = self._meta.create_topics(
            [replace(t, created_ms=t.created_ms or now) for t in templates], keep_ids=keep_ids
        )
        self.topics_version += 1
        for info in infos:
            self._topics[info.name] = info
            self._note_key_indexing(info)
            for q in range(info.queues):
                self._queues[(info.id, q)] = self._new_index(info, q)
        return infos

    def _note_key_indexing(self, info: TopicInfo) -> None:
        if indexes_topic(info.name, info.config):
            self._key_indexed.add(info.id)
        else:
            self._key_indexed.discard(info.id)

    def _new_index(self, info: TopicInfo, queue_id: int) -> QueueIndex:
        return QueueIndex(
            self._fs,
            queue_dir(self.config.data_dir, info, queue_id),
            entries_per_file=self.config.index_entries_per_file,
            cache=self._index_cache,
        )

    def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        cleanup_policy: CleanupPolicy | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> TopicInfo:
        """Change a topic. Queues can be added, never removed (offsets must stay valid)."""
        info = self.topic(name)
        if queues is not None and queues < info.queues:
            raise ConfigError(
                f"topic {name!r} has {info.queues} queues; queues can be added, not removed"
            )
        if queues is not None and queues > limits.MAX_QUEUES_PER_TOPIC:
            raise ConfigError(f"queues must be <= {limits.MAX_QUEUES_PER_TOPIC}")
        new = replace(
            info,
            queues=info.queues if queues is None else queues,
            cleanup_policy=cleanup_policy or info.cleanup_policy,
            retention_ms=info.retention_ms if retention_ms is None else retention_ms,
            retention_bytes=info.retention_bytes if retention_bytes is None else retention_bytes,
            config={**info.config, **(config or {})},
        )
        self.put_topic(new)
        return new

    def put_topic(self, new: TopicInfo) -> None:
        """Store a live topic's changed info (its queues may only grow)."""
        info = self._topics[new.name]
        self._meta.update_topic(new)
        self.topics_version += 1
        for q in range(info.queues, new.queues):
            self._queues[(info.id, q)] = self._new_index(new, q)
        self._topics[new.name] = new
        self._note_key_indexing(new)

    def delete_topic(self, name: str) -> None:
        """Remove a topic and its indexes. Its records stay in the log until retention
        deletes their segments; they are never visible again (topic ids are not reused)."""
        info = self.topic(name)
        self._meta.mark_deleted(info.id, self._clock.now_ms())
        self.topics_version += 1
        del self._topics[name]
        self._key_indexed.discard(info.id)
        self._producers.drop_topic(info.id)
        self.static.drop_topic(info.id)
        self.remote.drop_topic(info.id)
        for q in range(info.queues):
            self.compacted.drop((info.id, q))
            self.dirty_keys.pop((info.id, q), None)
            index = self._queues.pop((info.id, q))
            self._dirty_queues.discard((info.id, q))
            index.delete()
        directory = topic_dir(self.config.data_dir, info)
        if self._fs.exists(directory):  # a topic never written has none
            self._fs.remove_tree(directory)

    def topic(self, name: str) -> TopicInfo:
        self._check_open()
        info = self._topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name[:140]!r} does not exist")
        return info

    def topics(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def _index(self, topic: str, queue_id: int) -> tuple[TopicInfo, QueueIndex]:
        info = self.topic(topic)
        index = self._queues.get((info.id, queue_id))
        if index is None:
            raise QueueNotFound(f"topic {topic!r} has no queue {queue_id} (queues: {info.queues})")
        return info, index

    # ------------------------------------------------------------------ writing

    def note_producer_batch(
        self, key: tuple[int, int, int], stamp: ProducerStamp, count: int, base: int, end: int
    ) -> None:
        """A copied record's producer stamp (replication): dedupe retries of it later."""
        self._producers.record(key, stamp, count, base, end)
        if stamp.producer_id > self._last_producer_id:
            self._meta.note_producer_id(stamp.producer_id)
            self._last_producer_id = stamp.producer_id

    @property
    def producer_states(self) -> ProducerStates:
        """The idempotence windows (for replication's truncation)."""
        return self._producers

    def note_producer_id(self, producer_id: int) -> None:
        """Never hand out an id at or below `producer_id` from now on (a replica group's
        new term takes its ids from a block of its own)."""
        if producer_id > self._last_producer_id:
            self._meta.note_producer_id(producer_id)
            self._last_producer_id = producer_id

    def allocate_producer_id(self) -> int:
        producer_id = self._meta.next_producer_id()
        self._last_producer_id = max(self._last_producer_id, producer_id)
        return producer_id

    def append(
        self,
        topic: str,
        queue_id: int,
        payload: bytes | memoryview,
        *,
        producer: ProducerStamp | None = None,
        properties: bytes = b"",
        flags: int = 0,
    ) -> AppendResult:
        """Append one batch as one record. Checks the batch envelope and CRC, size limits,
        the topic and queue, producer sequence and disk space; on any failure nothing is
        written."""
        self._check_open()
        info, index = self._index(topic, queue_id)
        if self.static.read_only and (info.id, queue_id) in self.static.read_only:
            raise QueueMoved(
                f"queue {queue_id} of static topic {topic!r} is read-only on this broker: its "
                "write end is on another broker (or being switched, or was restored here "
                "from the tier: a remap opens it elsewhere); refresh the routes"
            )
        if len(payload) > self.config.max_batch_bytes:
            raise BatchTooLarge(
                f"batch of {len(payload)} bytes exceeds max_batch_bytes "
                f"({self.config.max_batch_bytes})"
            )
        if len(properties) > limits.MAX_PROPERTIES_BYTES:
            raise InvalidBatch(f"record properties exceed {limits.MAX_PROPERTIES_BYTES} bytes")
        env = parse_envelope(payload)
        if env.sparse:
            raise InvalidBatch("version-2 (compacted) batches are written by compaction only")
        # A tag no subscription can match is refused, also for producers that skip the
        # client's encoder (a batch without tags, the common case, costs nothing more).
        check_tags(payload, env)
        keys = None
        if info.cleanup_policy is not CleanupPolicy.DELETE:
            keys = message_keys(payload, topic)
        key = (info.id, queue_id, producer.producer_id if producer else NO_PRODUCER)
        if producer is not None:
            if not 1 <= producer.producer_id <= self._last_producer_id:
                # Only ids this store handed out dedupe: a made-up one could collide with
                # another producer's sequence and have its batches taken for duplicates.
                raise FencedProducer(
                    f"producer id {producer.producer_id} was never issued by this broker; "
                    "ask for one with INIT_PRODUCER"
                )
            seen = self._producers.check(key, producer, env.count)
            if seen is not None:
                return AppendResult(
                    seen.base_offset, seen.count, seen.end_position, 0, duplicate=True
                )
        self._watermark.reserve(len(payload) + len(properties) + _RECORD_OVERHEAD_BYTES)
        base = index.next_offset
        if info.config.get(TIMESTAMP_TYPE_KEY) == LOG_APPEND_TIME:
            # Every path into the topic (produce, timer delivery, transaction commit, pop
            # retry) gets the broker's time: readers substitute the record's store time.
            flags |= RecordFlags.LOG_APPEND_TIME
        rec = self._log.append(
            payload,
            properties,
            flags=flags,
            topic_id=info.id,
            queue_id=queue_id,
            count=env.count,
            base_offset=base,
            producer_id=key[2],
            base_sequence=producer.base_sequence if producer else -1,
            producer_epoch=producer.epoch if producer else -1,
            payload_crc=env.crc,
        )
        self.note_appended(info, queue_id, index, payload, env, rec, keys)
        end = rec.position + rec.size
        if producer is not None:
            self._producers.record(key, producer, env.count, base, end)
        return AppendResult(base, env.count, end, rec.store_time_ms)

    def note_appended(  # noqa: PLR0917 - two callers (append, the replica's), same facts
        self,
        info: TopicInfo,
        queue_id: int,
        index: QueueIndex,
        payload: bytes | memoryview,
        env: Envelope,
        rec: AppendedRecord,
        keys: list[bytes] | None,
    ) -> None:
        """Everything derived from a record just appended: its index entry, key index
        entries, a compact queue's dirty keys."""
        base = index.next_offset
        index.append(rec.position, rec.size, env.count, rec.store_time_ms, env.tag_summary)
        self._index_keys(info.id, queue_id, payload, env, base, rec)
        if keys is not None:
            dirty = self.dirty_keys.get((info.id, queue_id))
            if dirty is not None:
                dirty.update(zip(keys, range(base, base + env.count), strict=True))
        self._dirty_queues.add((info.id, queue_id))
        self._unindexed_entries += 1

    def _index_keys(  # noqa: PLR0917 - one caller, append, passing what it has
        self,
        topic_id: int,
        queue_id: int,
        payload: bytes | memoryview,
        env: Envelope,
        base: int,
        rec: AppendedRecord,
    ) -> None:
        if topic_id in self._key_indexed:
            self.key_index.add(
                batch_keys(payload, env),
                base_offset=base,
                log_position=rec.position,
                store_time_ms=rec.store_time_ms,
                topic_id=topic_id,
                queue_id=queue_id,
            )

    @property
    def watermark(self) -> DiskWatermark:
        return self._watermark

    def flush(self) -> int:
        """fdatasync the log (group commit); return the flushed position."""
        self._check_open()
        flushed = self._log.flush()
        self._last_flush_ms = self._clock.monotonic_ms()
        return flushed

    def begin_flush(self) -> tuple[int, Callable[[], None]]:
        """Group commit off the owner's thread: returns (target, sync). Run `sync()` on
        any thread (it only calls fdatasync), then `complete_flush(target)` or, on OSError,
        `fail_flush(error)`, both on the owner's thread. Appends may continue meanwhile."""
        self._check_open()
        return self._log.begin_flush()

    def complete_flush(self, target: int) -> None:
        self._log.complete_flush(target)
        self._last_flush_ms = self._clock.monotonic_ms()

    def fail_flush(self, error: OSError) -> StorageFailure:
        """The log is fenced; returns the StorageFailure to give every waiting append."""
        return self._log.fail_flush(error)

    def flush_due(self) -> bool:
        """Async mode: the flush interval has passed with unflushed records."""
        return (
            self.config.flush_mode is FlushMode.ASYNC
            and self._log.flushed_position < self._log.end_position
            and self._clock.monotonic_ms() - self._last_flush_ms >= self.config.flush_interval_ms
        )

    def checkpoint_due(self) -> bool:
        return (
            self._clock.monotonic_ms() - self._last_checkpoint_ms
            >= self.config.checkpoint_interval_ms
        )

    @property
    def flushed_position(self) -> int:
        return self._log.flushed_position

    @property
    def end_position(self) -> int:
        return self._log.end_position

    def tick(self) -> None:
        """Periodic work for the owner to call: the async-mode flush and the checkpoint."""
        self._check_open()
        now = self._clock.monotonic_ms()
        if (
            self.config.flush_mode is FlushMode.ASYNC
            and now - self._last_flush_ms >= self.config.flush_interval_ms
        ):
            self.flush()
        if now - self._last_checkpoint_ms >= self.config.checkpoint_interval_ms:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Flush the log, write pending index entries and producer state, then the
        checkpoint file. Recovery replays the log only past this point."""
        self._check_open()
        flushed = self.flush()
        self._check_checkpoint_room()
        ends: dict[tuple[int, int], int] = {}
        written: list[Path] = []
        new_dirs: dict[Path, None] = {}  # ordered: parents before children
        try:
            for key in self._dirty_queues:
                index = self._queues.get(key)
                if index is not None:
                    path = index.write_pending(sync=False)
                    if path is not None:
                        written.append(path)
                    new_dirs.update(dict.fromkeys(index.take_unsynced_dirs()))
                    ends[key] = index.next_offset
            key_file = self.key_index.write_pending()
            if key_file is not None:
                written.append(key_file)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise DiskFull(f"no space left to write queue indexes: {exc}") from None
            raise
        # All together: with traffic over thousands of queues, one fdatasync per index file
        # held the loop for most of each checkpoint (see OsFileSystem.sync_files).
        try:
            self._fs.sync_files(written)
            self._fs.sync_dirs(list(new_dirs))  # new index files' and queues' entries
        except OSError as exc:
            # As for the log (fsyncgate): the entries were handed to the kernel and marked
            # written, and a retry could "succeed" on pages the kernel dropped. Fence; a
            # restart re-derives every index past the last good checkpoint from the log.
            raise self._log.fail_flush(exc) from None
        self._dirty_queues.clear()
        self._seal_key_index()
        self._meta.save_producer_state(self._producers.take_dirty())
        cp = Checkpoint(flushed, flushed, self._log.last_store_time_ms)
        try:
            write_checkpoint(self._fs, self.config.data_dir, cp)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise DiskFull(f"no space left to write the checkpoint: {exc}") from None
            raise
        # Only after the checkpoint file: recovery expects each index, cut back to the
        # checkpoint, to reach its recorded end, so an end must never be ahead of it.
        if ends:
            self._meta.set_queue_index_ends(ends)
        self._indexed_position = flushed
        self._unindexed_entries = 0
        self._last_checkpoint_ms = self._clock.monotonic_ms()

    def _seal_key_index(self) -> None:
        try:
            self.key_index.seal_if_full()
        except OSError as exc:
            # Derived data: the open file stays whole and durable, and the seal is tried
            # again at the next checkpoint.
            log.warning("sealing a key index file failed (retried later): %s", exc)

    def _check_checkpoint_room(self) -> None:
        """Raise DiskFull, before writing anything, when the disk lacks the room this
        checkpoint needs. An index file that runs out of space midway keeps the partial
        entry it got, and the retry would append after it; so do not start one that
        cannot finish (best effort: other writers may take the room meanwhile)."""
        try:
            _, free = self._fs.disk_usage(self.config.data_dir)
        except OSError:
            return  # cannot tell
        # The entries, and one more per file for slack; a disk with no free block at all
        # reports 0 and is refused.
        needed = (self._unindexed_entries + len(self._dirty_queues)) * ENTRY.size
        if free < needed:
            raise DiskFull(
                f"checkpoint needs about {needed} bytes free, the disk has {free}; "
                "retried when space is freed"
            )

    # ------------------------------------------------------------------ reading

    @property
    def stable_position(self) -> int:
        """Records before this can never be taken back: flushed, and in a replica group
        committed. Compaction and offloading work only below it."""
        flushed = self._log.flushed_position
        return flushed if self.commit_limit is None else min(flushed, self.commit_limit)

    @property
    def visible_position(self) -> int:
        """Readers see records before this: flushed ones in sync mode, and in a replica
        group only those the group committed (`commit_limit`), which no failover can
        take back."""
        if self.config.flush_mode is FlushMode.SYNC:
            visible = self._log.flushed_position
        else:
            visible = self._log.end_position
        if self.commit_limit is not None:
            return min(visible, self.commit_limit)
        return visible

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, next offset) of a queue: the readable range is [min, next) (a
        compact queue's may have holes)."""
        info, index = self._index(topic, queue_id)
        return self._min_offset(info, queue_id, index), index.next_offset

    def static_chain(self, topic: str, queue_id: int) -> QueueChain | None:
        """The chain of a static queue this broker holds links of (None: not static)."""
        info, _ = self._index(topic, queue_id)
        return self.static.get(info.id, queue_id)

    def static_writable(self, topic: str, queue_id: int) -> bool:
        """Whether this broker holds the write end of a static queue."""
        info, _ = self._index(topic, queue_id)
        return self.static.is_writable(info.id, queue_id)

    def set_static_chain(
        self, topic: str, queue_id: int, chain: QueueChain, *, writable: bool
    ) -> None:
        info, _ = self._index(topic, queue_id)
        self.static.set(info.id, queue_id, chain, writable=writable)

    def seal_static_queue(
        self, topic: str, queue_id: int, sealed: Callable[[int], QueueChain]
    ) -> QueueChain:
        """Seal a static queue: refuse appends from now on, make what it holds durable,
        and store the chain `sealed(end)` builds from the queue's next offset, all in one
        call (nothing is appended in between)."""
        info, index = self._index(topic, queue_id)
        key = (info.id, queue_id)
        self.static.read_only.add(key)
        try:
            self.flush()
            chain = sealed(index.next_offset)
            self.static.set(info.id, queue_id, chain, writable=False)
        except BaseException:
            if (have := self.static.get(*key)) is None or have.write_end is not None:
                self.static.read_only.discard(key)
            raise
        return chain

    def compacted_end(self, topic: str, queue_id: int) -> int:
        """Offsets below this are served from the queue's compacted log (0: none)."""
        info, _ = self._index(topic, queue_id)
        compacted = self.compacted.get((info.id, queue_id))
        return 0 if compacted is None else compacted.end

    def _min_offset(self, info: TopicInfo, queue_id: int, index: QueueIndex) -> int:
        remote = self.remote.get((info.id, queue_id))
        if remote is not None:
            return remote.log_start
        compacted = self.compacted.get((info.id, queue_id))
        return index.min_offset if compacted is None else min(compacted.start, index.min_offset)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset whose message's timestamp is at or after `timestamp_ms` (the
        next offset if none), as Kafka's offsetsForTimes: the index finds the first batch
        stored at or after it (store time, in the index entries), and that batch's own
        message timestamps (the producer's, or the store time for LogAppendTime) pick the
        message in it; a batch whose messages are all older (timestamps set by the
        producer) is stepped over, up to `_TIME_SCAN_BATCHES` batches."""
        info, index = self._index(topic, queue_id)
        offset = index.offset_for_time(timestamp_ms)
        compacted = self.compacted.get((info.id, queue_id))
        in_compacted = None if compacted is None else compacted.offset_for_time(timestamp_ms)
        if in_compacted is not None:
            offset = min(offset, in_compacted)
        for _ in range(_TIME_SCAN_BATCHES):
            if offset >= index.next_offset:
                break
            found = self.read(topic, queue_id, offset, max_bytes=1).batches
            if not found:
                break
            batch = found[0]
            header = parse_header(batch.record)
            columns = with_append_time(header, decode_columns(batch.record[header.payload_start :]))
            stamps = columns.timestamps_ms
            offsets = message_offsets(columns, batch.base_offset)
            first = first_index_at(columns, batch.base_offset, offset)
            later = np.flatnonzero(stamps[first:] >= timestamp_ms)
            if len(later):
                return int(offsets[first + int(later[0])])
            offset = int(offsets[-1]) + 1
        return offset

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
    ) -> ReadResult:
        """Whole records from the batch holding `offset`, up to `max_bytes` (at least one
        batch when any is readable). With `tag_mask`, batches whose tag summary shares no
        bit with it are skipped without reading the log."""
        self._check_open()
        info, index = self._index(topic, queue_id)
        visible = self.visible_position
        lo, hi = self._min_offset(info, queue_id, index), index.next_offset
        if offset < lo or offset > hi:
            return ReadResult(ReadStatus.OFFSET_OUT_OF_RANGE, [], offset, lo, hi)
        if offset < index.min_offset and (info.id, queue_id) in self.remote:
            return ReadResult(ReadStatus.REMOTE, [], offset, lo, hi)
        batches: list[StoredBatch] = []
        budget = max_bytes
        next_offset = offset
        compacted = self.compacted.get((info.id, queue_id))
        if compacted is not None and offset < compacted.end:
            next_offset, budget = read_compacted(compacted, offset, batches, budget, tag_mask)
            if budget <= 0 or next_offset < compacted.end:
                status = ReadStatus.FOUND if batches else ReadStatus.NO_NEW_MESSAGE
                return ReadResult(status, batches, next_offset, lo, hi)
        entries = index.iter_entries(next_offset, _READ_SCAN_ENTRIES_MAX)
        for e in entries:
            if e.log_position + e.size > visible or (batches and e.size > budget):
                break
            next_offset = e.base_offset + e.count
            if tag_mask and not e.tag_summary & tag_mask:
                continue
            record = self._log.read(e.log_position, e.size)
            header = parse_header(record)
            if header.base_offset != e.base_offset or header.size != e.size:
                raise StorageFailure(
                    f"queue index of {topic}/{queue_id} points at the wrong record "
                    f"(offset {e.base_offset}, position {e.log_position})"
                )
            batches.append(StoredBatch(e.base_offset, e.count, e.store_time_ms, record))
            budget -= e.size
            if budget <= 0:
                break
        status = ReadStatus.FOUND if batches else ReadStatus.NO_NEW_MESSAGE
        return ReadResult(status, batches, next_offset, lo, hi)

    # ------------------------------------------------------------------ consumer offsets

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        self._check_open()
        self._meta.commit_offsets(group, offsets, self._clock.now_ms())

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        self._check_open()
        return self._meta.committed_offsets(group)

    def committed_offsets_with_time(self, group: str) -> dict[tuple[str, int], tuple[int, int]]:
        """The group's committed offsets with the time of each commit (epoch ms, this
        store's clock): (topic, queue) -> (next offset, committed_ms)."""
        self._check_open()
        return self._meta.committed_offsets_with_time(group)

    def groups(self) -> list[str]:
        return self._meta.groups()

    # ------------------------------------------------------------------ retention

    def pin_log(self, name: str, position: int) -> None:
        """Keep the commit log from `position` on: service `name` rescans it on restart."""
        self._log_pins[name] = position

    def unpin_log(self, name: str) -> None:
        self._log_pins.pop(name, None)

    @property
    def log_pin(self) -> int | None:
        return min(self._log_pins.values(), default=None)

    def trim_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Offsets below `offset` are no longer needed (a service's internal queue whose
        entries are all delivered): retention may delete them."""
        self._check_open()
        info, index = self._index(topic, queue_id)
        if offset > index.min_offset:
            index.advance_min_offset(offset)
            self._meta.set_queue_min_offsets({(info.id, queue_id): index.min_offset})

    def enforce_retention(self) -> int:
        """Apply every topic's time and size retention; delete log segments no queue needs.
        Returns the number of segments deleted."""
        from tidemq.store.retention import apply_retention  # noqa: PLC0415

        self._check_open()
        return apply_retention(self)

    # ------------------------------------------------------------------ compaction

    def compaction_due(self) -> list[CompactionDue]:
        """Compact queues due for a run (see `compactor.compaction_due`)."""
        self._check_open()
        return compactor.compaction_due(self)

    def plan_compaction(self, topic: str, queue_id: int) -> CompactionJob:
        """Step 1 of a run, here; step 2 is `compaction.run_compaction(job)` on any
        thread; step 3 `install_compaction` (or `abandon_compaction`) here again."""
        self._check_open()
        return compactor.plan_compaction(self, topic, queue_id)

    def install_compaction(self, result: CompactionResult) -> bool:
        self._check_open()
        return compactor.install_compaction(self, result)

    def abandon_compaction(self, job: CompactionJob) -> None:
        compactor.abandon_compaction(self, job)

    def compact(
        self, topic: str, queue_id: int, *, max_keys: int | None = None
    ) -> CompactionResult:
        """One whole compaction run of a queue on the calling thread."""
        self._check_open()
        return compactor.compact(
            self, topic, queue_id, max_keys=max_keys or compactor.DEFAULT_MAX_KEYS
        )

    def find_by_key(
        self, topic: str, key: bytes, *, start_ms: int, end_ms: int, limit: int
    ) -> KeyMatches:
        """Stored messages of `topic` carrying `key` (as `key` or one of `keys`), stored in
        [start_ms, end_ms], newest first, at most `limit` (key_lookup.py)."""
        self._check_open()
        return find_by_key(self, topic, key, start_ms=start_ms, end_ms=end_ms, limit=limit)

    def key_indexed(self, topic: str) -> bool:
        """Whether the topic's messages go into the key index (no key.index=false)."""
        return self.topic(topic).id in self._key_indexed

    def lookup_key(self, topic: str, queue_id: int, key: bytes) -> FoundMessage | None:
        """The latest readable message of `key` in a compact queue (value None: a
        tombstone; None: no such key)."""
        self._check_open()
        return compactor.lookup_key(self, topic, queue_id, key)

    # ------------------------------------------------------------------ internals for
    # recovery and retention (same package)

    @property
    def log(self) -> CommitLog:
        return self._log

    @property
    def fs(self) -> FileSystem:
        return self._fs

    def topics_by_id(self) -> dict[int, TopicInfo]:
        return {t.id: t for t in self._topics.values()}

    def queue_dir(self, info: TopicInfo, queue_id: int) -> Path:
        """The queue's directory, for files that are not derived (compacted logs): the
        directories the topic's indexes made without syncing (see QueueIndex) are synced
        first, the topic's own directory among them, which any of its queues may have
        made: a file put there must not vanish with a directory entry."""
        for q in range(info.queues):
            index = self._queues.get((info.id, q))
            if index is not None:
                for directory in index.take_unsynced_dirs():
                    self._fs.sync_dir(directory)
        return queue_dir(self.config.data_dir, info, queue_id)

    @property
    def metadata(self) -> Metadata:
        return self._meta

    @property
    def clock(self) -> Clock:
        return self._clock

    def mark_all_queues_dirty(self) -> None:
        self._dirty_queues.update(self._queues)

    def queue_indexes(self) -> dict[tuple[int, int], QueueIndex]:
        return self._queues

    def index_of(self, topic: str, queue_id: int) -> tuple[TopicInfo, QueueIndex]:
        """A live topic's info and one queue's index (for the store's helper modules)."""
        self._check_open()
        return self._index(topic, queue_id)

    @property
    def replica(self) -> ReplicaView:
        """Log replication's reads and appends (`replica_log.py`)."""
        return ReplicaView(self)

    @property
    def offload(self) -> OffloadView:
        """Tiered storage's reads and records (`offload.py`)."""
        return OffloadView(self)

    @property
    def indexed_position(self) -> int:
        """Position up to which the last checkpoint holds every index entry."""
        return self._indexed_position

    def close(self) -> None:
        """Checkpoint and close. Safe to call twice."""
        if self._closed:
            return
        try:
            self.checkpoint()
        except (StorageFailure, OSError):
            pass  # a fenced log cannot checkpoint; recovery will replay instead
        finally:
            self._closed = True
            self.compacted.close()
            self._log.close()
            self._meta.close()


def read_compacted(
    compacted: CompactedLog, offset: int, out: list[StoredBatch], budget: int, tag_mask: int
) -> tuple[int, int]:
    """Append to `out` the compacted records from the one holding `offset`, within `budget`
    bytes (at least one record). Returns (next offset to read, budget left); the next
    offset is the log's end once every record was read."""
    for e in compacted.entries_from(offset):
        size = int(e["size"])
        if out and size > budget:
            return int(e["base_offset"]), budget
        if tag_mask and not int(e["tag_summary"]) & tag_mask:
            continue
        record = compacted.read(int(e["position"]), size)
        out.append(
            StoredBatch(int(e["base_offset"]), int(e["count"]), int(e["store_time_ms"]), record)
        )
        budget -= size
        if budget <= 0:
            return int(e["end_offset"]), budget
    return compacted.end, budget


def topic_dir(data_dir: Path, info: TopicInfo) -> Path:
    # Ids make the directory unique: a topic deleted and created again never meets the
    # files of its namesake, even after a crash in the middle of a delete.
    return data_dir / "queues" / f"{info.id}-{info.name}"


def queue_dir(data_dir: Path, info: TopicInfo, queue_id: int) -> Path:
    return topic_dir(data_dir, info) / str(queue_id)
