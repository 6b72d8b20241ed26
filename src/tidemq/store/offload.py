"""The store's side of tiered storage: what the broker's tier service reads and records.

The tier service (`tidemq.broker.tier_service`) asks for the durable batches of a queue
past its remote end, uploads them, and then records here that they are remote
(`set_remote_end`); remote retention records here what is gone (`set_log_start`). See
`remote_ranges.py` for the two offsets and the rule they keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.core.errors import StorageFailure
from tidemq.core.record import parse_header
from tidemq.store.remote_ranges import RemoteRange

if TYPE_CHECKING:
    from tidemq.store.message_store import MessageStore, StoredBatch

__all__ = ["OffloadView", "QueueTierState"]

#: Index entries looked at per call, whatever the byte budget (bounds one call's work).
_MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class QueueTierState:
    remote: RemoteRange | None
    local_min: int
    next_offset: int
    #: Record bytes stored locally from the remote end (or the local min) on.
    local_bytes: int


class OffloadView:
    def __init__(self, store: MessageStore) -> None:
        self._store = store

    def state(self, topic: str, queue_id: int) -> QueueTierState:
        info, index = self._store.index_of(topic, queue_id)
        remote = self._store.remote.get((info.id, queue_id))
        start = index.min_offset if remote is None else max(remote.remote_end, index.min_offset)
        entries = index.all_entries()
        live = entries[entries["base_offset"] + entries["count"] > start]
        return QueueTierState(
            remote, index.min_offset, index.next_offset, int(live["size"].astype("i8").sum())
        )

    def pending_messages(self, topic: str, queue_id: int) -> int:
        """Messages stored locally past the remote end: offsets only, no index read (a
        metrics scrape asks this of every tiered queue)."""
        info, index = self._store.index_of(topic, queue_id)
        remote = self._store.remote.get((info.id, queue_id))
        start = index.min_offset if remote is None else max(remote.remote_end, index.min_offset)
        return max(0, index.next_offset - start)

    def open_range(self, topic: str, queue_id: int) -> RemoteRange:
        """The queue's remote range, created empty at its min offset on first use."""
        info, index = self._store.index_of(topic, queue_id)
        key = (info.id, queue_id)
        have = self._store.remote.get(key)
        if have is None:
            self._store.remote.set(key, index.min_offset, index.min_offset)
            have = self._store.remote.get(key)
            assert have is not None
        return have

    def batches(self, topic: str, queue_id: int, offset: int, max_bytes: int) -> list[StoredBatch]:
        """Whole durable batches from the one starting at `offset` (a batch boundary), up
        to `max_bytes` (at least one when any is durable). Never a batch past the flushed
        position: what is uploaded can never be lost from the local log by a crash."""
        from tidemq.store.message_store import StoredBatch  # noqa: PLC0415 - cycle

        _, index = self._store.index_of(topic, queue_id)
        flushed = self._store.stable_position  # in a replica group: committed too
        out: list[StoredBatch] = []
        budget = max_bytes
        for e in index.iter_entries(offset, _MAX_ENTRIES):
            if e.log_position + e.size > flushed or (out and e.size > budget):
                break
            if not out and e.base_offset != offset:
                raise StorageFailure(
                    f"{topic}/{queue_id}: offload from {offset}, which is not a batch start"
                )
            record = self._store.log.read(e.log_position, e.size)
            if parse_header(record).base_offset != e.base_offset:
                raise StorageFailure(f"index of {topic}/{queue_id} points at the wrong record")
            out.append(StoredBatch(e.base_offset, e.count, e.store_time_ms, record))
            budget -= e.size
            if budget <= 0:
                break
        return out

    def set_remote_end(self, topic: str, queue_id: int, end: int) -> None:
        """Offsets below `end` are verified in the object store and in its manifest."""
        info, index = self._store.index_of(topic, queue_id)
        have = self.open_range(topic, queue_id)
        if not have.remote_end <= end <= index.next_offset:
            raise StorageFailure(
                f"{topic}/{queue_id}: remote end {end} outside {have.remote_end}.."
                f"{index.next_offset}"
            )
        self._store.remote.set((info.id, queue_id), have.log_start, end)

    def restore_queue(self, topic: str, queue_id: int, log_start: int, remote_end: int) -> None:
        """An empty queue continues where its offloaded data ends (a broker rebuilt from
        the tier): [log_start, remote_end) is remote, the next message gets remote_end."""
        info, index = self._store.index_of(topic, queue_id)
        key = (info.id, queue_id)
        if index.next_offset != 0 or key in self._store.remote:
            raise StorageFailure(f"{topic}/{queue_id} is not empty: it cannot be restored")
        index.reset(remote_end)
        # What recovery reads back: the queue's start and its end as of a checkpoint.
        self._store.metadata.set_queue_min_offsets({key: remote_end})
        self._store.metadata.set_queue_index_ends({key: remote_end})
        self._store.remote.set(key, log_start, remote_end)

    def set_log_start(self, topic: str, queue_id: int, start: int) -> None:
        """Offsets below `start` are gone (remote retention): local copies of them too."""
        info, index = self._store.index_of(topic, queue_id)
        have = self.open_range(topic, queue_id)
        if start <= have.log_start:
            return
        self._store.remote.set((info.id, queue_id), start, have.remote_end)
        if start > index.min_offset:
            index.advance_min_offset(min(start, index.next_offset))
            self._store.metadata.set_queue_min_offsets({(info.id, queue_id): index.min_offset})
