"""Compaction as the store's owner drives it: which queues are due, planning a run,
switching to its result, and key lookups (`Admin.get`).

The run itself (`compaction.run_compaction`) may go to another thread or process (the
broker's goes to a worker process); everything here runs on the store's owner thread.
`compact` does all three steps in a row on the calling thread (tests, a store used as a
library without a broker).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from tidemq.core.errors import ConfigError
from tidemq.store.compacted_log import CompactedLog, compacted_dir
from tidemq.store.compacted_queues import CompactedQueues, FoundMessage, message_in_record
from tidemq.store.compaction import (
    CompactionJob,
    CompactionResult,
    SegmentReader,
    record_keys,
    run_compaction,
)
from tidemq.store.compaction_settings import compaction_settings
from tidemq.store.metadata import CleanupPolicy, TopicInfo
from tidemq.store.queue_index import QueueIndex

if TYPE_CHECKING:
    from tidemq.store.message_store import MessageStore

__all__ = [
    "CompactionDue",
    "compact",
    "compaction_due",
    "install_compaction",
    "lookup_key",
    "plan_compaction",
]

#: Index entries one run takes from the dirty range (a larger one is done in parts).
_DIRTY_ENTRIES_MAX: Final = 262_144
#: Keys one run maps (Kafka's dedupe buffer; about 150 MB of Python dict at the limit).
DEFAULT_MAX_KEYS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class CompactionDue:
    topic: str
    queue_id: int
    dirty_bytes: int
    clean_bytes: int
    reason: str


def _is_compact(info: TopicInfo) -> bool:
    return info.cleanup_policy is not CleanupPolicy.DELETE


def _cleanable(store: MessageStore, info: TopicInfo, queue_id: int) -> npt.NDArray[np.void]:
    """Commit-log entries past the compacted log that compaction may take: flushed (no
    crash can take them back) and older than `min.compaction.lag.ms`. One array, no
    object per entry: the broker asks this of every compact queue at every check."""
    index = store.queue_indexes()[(info.id, queue_id)]
    settings = compaction_settings(info.config)
    compacted = store.compacted.get((info.id, queue_id))
    start = index.min_offset if compacted is None else max(compacted.end, index.min_offset)
    entries = index.entries_array_from(start, _DIRTY_ENTRIES_MAX)
    newest = store.clock.now_ms() - settings.min_lag_ms
    ok = (entries["log_position"] + entries["size"] <= store.stable_position) & (
        entries["store_time_ms"] <= newest
    )
    stop = len(ok) if ok.all() else int(np.argmin(ok))
    return entries[:stop]


def compaction_due(store: MessageStore) -> list[CompactionDue]:
    """Compact queues that need a run now: the dirty share of the queue reached
    `min.cleanable.dirty.ratio`, a message waited `max.compaction.lag.ms`, or a tombstone's
    `delete.retention.ms` ran out."""
    now = store.clock.now_ms()
    due: list[CompactionDue] = []
    for info in store.topics():
        if not _is_compact(info):
            continue
        settings = compaction_settings(info.config)
        for q in range(info.queues):
            compacted = store.compacted.get((info.id, q))
            dirty = _cleanable(store, info, q)
            dirty_bytes = int(dirty["size"].sum())
            clean = compacted.size if compacted is not None else 0
            reason = ""
            if dirty_bytes and dirty_bytes >= settings.dirty_ratio * (dirty_bytes + clean):
                reason = "dirty ratio"
            elif len(dirty) and int(dirty["store_time_ms"][0]) + settings.max_lag_ms <= now:
                reason = "max.compaction.lag.ms"
            elif compacted is not None:
                expiry = compacted.next_tombstone_expiry(settings.delete_retention_ms)
                if expiry is not None and expiry <= now:
                    reason = "delete.retention.ms"
            if reason:
                due.append(CompactionDue(info.name, q, dirty_bytes, clean, reason))
    return due


def plan_compaction(
    store: MessageStore, topic: str, queue_id: int, *, max_keys: int = DEFAULT_MAX_KEYS
) -> CompactionJob:
    """Snapshot what a run reads; pins the commit log under it until the result is
    installed or abandoned (`abandon_compaction`)."""
    info = store.topic(topic)
    if not _is_compact(info):
        raise ConfigError(
            f"topic {topic!r} has cleanup.policy {info.cleanup_policy.value}: only compact "
            "topics are compacted"
        )
    key = (info.id, queue_id)
    index = store.queue_indexes().get(key)
    if index is None:
        raise ConfigError(f"topic {topic!r} has no queue {queue_id}")
    compacted = store.compacted.get(key)
    dirty = _cleanable(store, info, queue_id)
    if len(dirty):
        store.pin_log(_pin_name(key), int(dirty["log_position"][0]))
    segments = store.log.segments
    return CompactionJob(
        topic=topic,
        topic_id=info.id,
        queue_id=queue_id,
        start=_start(index, compacted),
        old=None if compacted is None else compacted.snapshot(),
        dirty=dirty,
        now_ms=store.clock.now_ms(),
        delete_retention_ms=compaction_settings(info.config).delete_retention_ms,
        directory=compacted_dir(store.queue_dir(info, queue_id)),
        generation=1 if compacted is None else compacted.generation + 1,
        max_keys=max_keys,
        fs=store.fs,
        log=SegmentReader(store.fs, segments.directory, segments.segment_starts()),
    )


def _start(index: QueueIndex, compacted: CompactedLog | None) -> int:
    return index.min_offset if compacted is None else min(compacted.start, index.min_offset)


def _pin_name(key: tuple[int, int]) -> str:
    return f"compaction/{key[0]}/{key[1]}"


def abandon_compaction(store: MessageStore, job: CompactionJob) -> None:
    job.log.close()
    store.unpin_log(_pin_name((job.topic_id, job.queue_id)))


def install_compaction(store: MessageStore, result: CompactionResult) -> bool:
    """Switch the queue to the new generation (False, and the file removed, when the
    queue changed meanwhile: topic deleted, or another run switched first)."""
    job = result.job
    key = (job.topic_id, job.queue_id)
    abandon_compaction(store, job)
    info = store.topics_by_id().get(job.topic_id)
    current = store.compacted.get(key)
    current_generation = 0 if current is None else current.generation
    job_generation = 0 if job.old is None else job.old.generation
    if info is None or info.id != job.topic_id or current_generation != job_generation:
        if store.fs.exists(result.path):
            store.fs.remove(result.path)
        return False
    start = job.start if current is None else max(job.start, current.start)
    new = CompactedLog.open(store.fs, result.path, generation=job.generation, start=start)
    store.compacted.switch(key, new)
    store.queue_indexes()[key].advance_min_offset(new.end)
    dirty = store.dirty_keys.get(key)
    if dirty is not None:
        for k in [k for k, offset in dirty.items() if offset < new.end]:
            del dirty[k]
    return True


def compact(
    store: MessageStore, topic: str, queue_id: int, *, max_keys: int = DEFAULT_MAX_KEYS
) -> CompactionResult:
    """Plan, run and install one run on the calling thread."""
    job = plan_compaction(store, topic, queue_id, max_keys=max_keys)
    try:
        result = run_compaction(job)
    except BaseException:
        abandon_compaction(store, job)
        raise
    install_compaction(store, result)
    return result


def lookup_key(store: MessageStore, topic: str, queue_id: int, key: bytes) -> FoundMessage | None:
    """The latest readable message of `key` in a compact queue (None: none); a tombstone
    has value None. A few reads: the queue's dirty-key table (built on the first lookup,
    then kept by `append`), else the compacted log's key index."""
    info = store.topic(topic)
    if not _is_compact(info):
        raise ConfigError(
            f"topic {topic!r} is not a compact topic (cleanup.policy "
            f"{info.cleanup_policy.value}); key lookups need cleanup.policy compact"
        )
    qkey = (info.id, queue_id)
    index = store.queue_indexes().get(qkey)
    if index is None:
        raise ConfigError(f"topic {topic!r} has no queue {queue_id}")
    compacted = store.compacted.get(qkey)
    dirty_from = index.min_offset if compacted is None else max(compacted.end, index.min_offset)
    dirty = store.dirty_keys.get(qkey)
    if dirty is None:
        dirty = store.dirty_keys[qkey] = dict(_dirty_keys(store, index, dirty_from))
    if key in dirty:
        found = _message_in_log(store, topic, queue_id, dirty[key])
        if found is not None:
            return found
        # Its latest write is not readable yet (not flushed): the one before it is.
        older = [o for k, o in _dirty_keys(store, index, dirty_from, visible=True) if k == key]
        if older:
            return _message_in_log(store, topic, queue_id, older[-1])
    return None if compacted is None else CompactedQueues.find(compacted, key)


def _dirty_keys(
    store: MessageStore, index: QueueIndex, offset: int, *, visible: bool = False
) -> Iterator[tuple[bytes, int]]:
    """(key, offset) of every keyed message from `offset` on, in offset order (only the
    readable ones with `visible`)."""
    limit = store.visible_position
    for entry in index.iter_entries(offset, index.next_offset - offset + 1):
        if visible and entry.log_position + entry.size > limit:
            return
        keys = record_keys(store.log.read(entry.log_position, entry.size))
        for i, key in enumerate(keys):
            if key is not None:
                yield key, entry.base_offset + i


def _message_in_log(
    store: MessageStore, topic: str, queue_id: int, offset: int
) -> FoundMessage | None:
    """The message at `offset` of the commit-log part (None: not readable yet)."""
    found = store.read(topic, queue_id, offset, max_bytes=1).batches
    return message_in_record(found[0].record, offset) if found else None
